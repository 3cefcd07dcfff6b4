"""The CPU primitives on float16 and bfloat16 (a model as mlx-community ships it: 4-bit
weights with bfloat16 scales, norms and activations, its KV cache in bfloat16).

Each primitive computes in float32 from the exactly converted half values and rounds its
output once: its result is the float32 primitive's on the same values, rounded by MLX's
own ``astype`` (bit for bit), and within half-precision rounding of MLX's ops. A row keeps
its bits alone and in a padded batch, and a real bfloat16 model decodes through the
primitives, within bfloat16 rounding alone and in a batch and of its float32 copy."""

import sys

import numpy as np
import pytest

import mlx_lm_batched  # noqa: F401  (the BLAS and the kernels load before mlx.core)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from conftest import corpus_prompts, greedy_logprobs  # noqa: E402
from mlx_lm_batched import _cpu_prims  # noqa: E402
from mlx_lm_batched.engine.batch_engine import BatchEngine  # noqa: E402
from mlx_lm_batched.layers import cpu_ops  # noqa: E402
from mlx_lm_batched.loading.dequantize import cast_floats  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the kernels are built on Linux (the CPU backend's)")

HALVES = [mx.bfloat16, mx.float16]
# MLX's own half-precision ops round after every step; ours once: they agree to a few
# units in the last place of the half type (bfloat16 keeps 8 bits, float16 11).
ULP = {mx.bfloat16: 2.0 ** -7, mx.float16: 2.0 ** -10}


@pytest.fixture(scope="module")
def kernel():
    module = _cpu_prims.module()
    assert module is not None, _cpu_prims.problem
    return module


def random(shape, seed, dtype, scale=1.0):
    return (mx.random.normal(shape, key=mx.random.key(seed)) * scale).astype(dtype)


def f32(*arrays):
    return [a.astype(mx.float32) for a in arrays]


def assert_near(got, want, dtype, ulps=4):
    """Within ``ulps`` units of the half type's last place of the larger magnitude."""
    got, want = np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))
    bound = ulps * ULP[dtype] * np.maximum(np.abs(want), 1.0)
    assert (np.abs(got - want) <= bound).all(), float(np.abs(got - want).max())


@pytest.mark.parametrize("dtype", HALVES)
def test_rms_norm_is_the_float32_norm_rounded_once(kernel, dtype):
    x, w = random((4, 3, 576), 1, dtype, 3.0), random((576,), 2, dtype)
    got = kernel.rms_norm(x, w, 1e-5)
    assert got.dtype == dtype
    assert mx.array_equal(got, kernel.rms_norm(*f32(x, w), 1e-5).astype(dtype)).item()
    assert_near(got, mx.fast.rms_norm(x, w, 1e-5), dtype)
    # A float32 weight promotes the output to float32, as mx.fast.rms_norm does.
    promoted = kernel.rms_norm(x, w.astype(mx.float32), 1e-5)
    assert promoted.dtype == mx.float32
    assert mx.array_equal(promoted, kernel.rms_norm(*f32(x, w), 1e-5)).item()
    # A strided view (the last axis transposed in) is read as its values.
    view = random((4, 576, 3), 3, dtype).swapaxes(1, 2)
    assert mx.array_equal(kernel.rms_norm(view, None, 1e-5),
                          kernel.rms_norm(view.astype(mx.float32), None, 1e-5).astype(dtype)).item()


@pytest.mark.parametrize("dtype", HALVES)
def test_rope_and_swiglu_are_the_float32_ones_rounded_once(kernel, dtype):
    x = random((2, 9, 5, 64), 4, dtype)
    inv = _cpu_prims.inverse_frequencies(64, 10000.0)
    offset = mx.array([3, 200], dtype=mx.int32)
    got = kernel.rope(x, 64, False, inv, 1.0, offset)
    assert got.dtype == dtype
    assert mx.array_equal(got, kernel.rope(*f32(x), 64, False, inv, 1.0, offset).astype(dtype)).item()
    for b in range(2):
        want = mx.fast.rope(x[b:b + 1], 64, traditional=False, base=10000.0, scale=1.0,
                            offset=int(offset[b]))
        assert_near(got[b:b + 1], want, dtype)
    gate, up = random((3, 2, 1536), 5, dtype, 4.0), random((3, 2, 1536), 6, dtype)
    got = kernel.swiglu(gate, up)
    assert got.dtype == dtype
    assert mx.array_equal(got, kernel.swiglu(*f32(gate, up)).astype(dtype)).item()
    assert_near(got, nn.silu(gate) * up, dtype, ulps=8)


@pytest.mark.parametrize("dtype", HALVES)
def test_decode_attention_reads_half_keys_and_values_in_place(kernel, dtype):
    B, H, n_kv, S, D = 3, 9, 3, 70, 64
    q, k, v = random((B, H, 1, D), 7, dtype), random((B, n_kv, S, D), 8, dtype), \
        random((B, n_kv, S, D), 9, dtype)
    mask = mx.array(np.random.default_rng(0).random((B, 1, 1, S)) > 0.3)
    got = kernel.decode_attention(q, k, v, 0.125, mask)
    assert got.dtype == dtype
    want = kernel.decode_attention(*f32(q, k, v), 0.125, mask).astype(dtype)
    assert mx.array_equal(got, want).item()
    # Keys as a strided view (a cache laid out slots first), and held in two segments.
    k_view = random((B, S, n_kv, D), 8, dtype).swapaxes(1, 2)
    assert mx.array_equal(kernel.decode_attention(q, k_view, v, 0.125, mask),
                          kernel.decode_attention(*f32(q, k_view, v), 0.125, mask).astype(dtype)).item()
    split = kernel.decode_attention_segments(q, [k[:, :, :20], k[:, :, 20:]],
                                             [v[:, :, :20], v[:, :, 20:]], 0.125, mask)
    assert mx.array_equal(split, got).item()
    # MLX's attention in the half type, masked slots at -inf.
    scores = (q.astype(mx.float32) * 0.125) @ mx.repeat(k, H // n_kv, 1).astype(mx.float32).swapaxes(-1, -2)
    scores = mx.where(mask, scores, -mx.inf)
    reference = mx.softmax(scores, -1) @ mx.repeat(v, H // n_kv, 1).astype(mx.float32)
    assert_near(got, reference, dtype)
    # One dtype for the three.
    with pytest.raises(ValueError, match="one dtype"):
        kernel.decode_attention(q, *f32(k, v), 0.125, mask)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_row_keeps_its_bits_alone_and_in_a_padded_batch(kernel, dtype):
    q, k, v = random((1, 4, 1, 32), 10, dtype), random((1, 2, 12, 32), 11, dtype), \
        random((1, 2, 12, 32), 12, dtype)
    alone = kernel.decode_attention(q, k, v, 0.5, None)
    pad = 5  # the row left-padded by 5 slots in a batch with another row
    other = [random((1, 4, 1, 32), 13, dtype), random((1, 2, 17, 32), 14, dtype),
             random((1, 2, 17, 32), 15, dtype)]
    batch_k = mx.concatenate([mx.concatenate([mx.zeros((1, 2, pad, 32), dtype), k], 2),
                              other[1]])
    batch_v = mx.concatenate([mx.concatenate([mx.zeros((1, 2, pad, 32), dtype), v], 2),
                              other[2]])
    mask = mx.concatenate([mx.array([[[[False] * pad + [True] * 12]]]),
                           mx.ones((1, 1, 1, 17), mx.bool_)])
    batched = kernel.decode_attention(mx.concatenate([q, other[0]]), batch_k, batch_v, 0.5, mask)
    assert mx.array_equal(batched[:1], alone).item()
    x = random((5, 576), 16, dtype)
    assert mx.array_equal(kernel.rms_norm(x, None, 1e-6)[2:3], kernel.rms_norm(x[2:3], None, 1e-6)).item()


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("rows,K,N", [(1, 576, 192), (3, 100, 37), (64, 576, 1536),
                                      (65, 576, 1536), (300, 1536, 576)])
def test_half_weights_multiply_in_float32(kernel, dtype, rows, K, N):
    # Decode rows (up to 64) by the kernel reading the half weight in place, more by the
    # BLAS on converted blocks: both to float32 rounding of the float64 product, the
    # output in the dtype MLX's matmul gives.
    x = random((rows, K), 30, mx.float32)
    w, b = random((N, K), 31, dtype, 0.05), random((N,), 32, dtype)
    want = np.array(x).astype(np.float64) @ np.array(w.astype(mx.float32)).astype(np.float64).T \
        + np.array(b.astype(mx.float32))
    got = kernel.half_linear(x, w, b)
    assert got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    half = kernel.half_linear(x.astype(dtype), w, b)
    assert half.dtype == dtype
    assert mx.array_equal(half, kernel.half_linear(x.astype(dtype).astype(mx.float32), w, b)
                          .astype(dtype)).item()
    # A strided weight (a transposed view) is read as its values.
    view = random((K, N), 33, dtype).T
    assert mx.allclose(kernel.half_linear(x, view), x @ view.astype(mx.float32).T,
                       rtol=1e-5, atol=1e-4).item()


def test_a_row_of_half_weights_keeps_its_bits_in_any_decode_batch(kernel):
    x = random((64, 576), 34, mx.float32)
    w = random((1536, 576), 35, mx.bfloat16, 0.05)
    full = kernel.half_linear(x, w)
    for rows in (slice(0, 1), slice(5, 9), slice(60, 64), slice(3, 40)):
        assert mx.array_equal(kernel.half_linear(x[rows], w), full[rows]).item()
    with pytest.raises(ValueError, match="float16 or bfloat16 weight"):
        kernel.half_linear(x, w.astype(mx.float32))


def test_layers_route_half_linears_and_embeddings_through_it(kernel, monkeypatch):
    layer = nn.Linear(64, 32, bias=True)
    layer.set_dtype(mx.bfloat16)
    embedding = nn.Embedding(50, 64)
    embedding.set_dtype(mx.bfloat16)
    x = random((2, 1, 64), 36, mx.bfloat16)
    calls = []
    half_linear = _cpu_prims.linear
    monkeypatch.setattr(_cpu_prims, "linear", lambda *a: calls.append(a[1].dtype) or half_linear(*a))
    out, logits = cpu_ops.linear(layer, x), cpu_ops.tied_logits(embedding, x)
    assert calls == [mx.bfloat16, mx.bfloat16] and out.dtype == logits.dtype == mx.bfloat16
    assert_near(out, layer(x), mx.bfloat16)
    assert_near(logits, embedding.as_linear(x), mx.bfloat16, ulps=8)


def test_prefill_attention_of_half_inputs_runs_in_float32(kernel):
    q, k, v = (random((2, 4, 48, 32), s, mx.bfloat16) for s in (17, 18, 19))
    mask = mx.tril(mx.ones((48, 48), mx.bool_))
    got = cpu_ops.attention(q, k, v, 0.2, mask)
    assert got.dtype == mx.bfloat16
    assert mx.array_equal(got, cpu_ops.attention(*f32(q, k, v), 0.2, mask).astype(mx.bfloat16)).item()


def bf16_quantized(model):
    """``model`` as mlx-community ships SmolLM2: 4-bit weights (group 64), bfloat16 scales,
    norms and activations."""
    cast_floats(model, mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    return model


def greedy(model, prompts, steps):
    logprobs, tokens = greedy_logprobs(model, prompts, steps)
    return tokens, logprobs


def assert_near_the_float32_model(model, prompts, tokens, logprobs):
    """Cast ``model``'s floats to float32 and compare the first greedy step: each row's
    half-precision token is the float32 model's best or within 0.1 of it (a near tie), and
    the log-probabilities differ by half-precision rounding through the layers."""
    cast_floats(model, mx.float32)
    f32_tokens, f32_logprobs = greedy(model, prompts, 0)
    best = np.take_along_axis(f32_logprobs[0], f32_tokens[0][:, None], -1)
    ours = np.take_along_axis(f32_logprobs[0], tokens[0][:, None].astype(np.int64), -1)
    assert (best - ours).max() < 0.1
    difference = np.abs(logprobs[0] - f32_logprobs[0])
    assert np.median(difference) < 0.1 and difference.max() < 0.5


def test_a_bfloat16_quantized_model_decodes_through_the_primitives(float_dirs, kernel, monkeypatch):
    from mlx_lm_batched import load

    model, tokenizer = load(str(float_dirs["smollm2"]))
    model = bf16_quantized(model)
    prompts = corpus_prompts(tokenizer, (30, 52, 41))
    calls = {name: [] for name in ("attend", "rms_norm", "rope", "swiglu")}
    for name in calls:
        function = getattr(_cpu_prims, name)

        def counted(*args, _name=name, _function=function):
            out = _function(*args)
            if out is not None:
                calls[_name].append((args[0].shape, out.dtype))
            return out
        monkeypatch.setattr(_cpu_prims, name, counted)
    tokens, logprobs = greedy(model, prompts, 6)
    monkeypatch.undo()
    layers = len(model.layers)
    # Every layer of every one-column call of the batch (the prefill's last column, fed
    # alone as mlx-lm's, and the 6 steps) through the decode attention, in bfloat16.
    assert sum(shape[0] == 3 for shape, _ in calls["attend"]) == 7 * layers
    # Norms, RoPE and SwiGLU through the primitives, in every layer of every step.
    decode = {name: sum(shape[:2] == (3, 1) or shape[0] == 3 and shape[2] == 1
                        for shape, _ in found) for name, found in calls.items()}
    assert decode["rms_norm"] >= 6 * (2 * layers + 1), decode
    assert decode["rope"] >= 6 * 2 * layers and decode["swiglu"] >= 6 * layers, decode
    assert {dtype for found in calls.values() for _, dtype in found} == {mx.bfloat16}
    # Each row alone: its first token and log-probabilities within bfloat16 rounding.
    # Not bit for bit: alone, a prompt of 64 tokens or fewer takes the decode kernel, in a
    # batch the BLAS (float32 sums in another order, rounded to bfloat16 after every
    # layer), so a later greedy token may differ where two candidates are within rounding
    # (as before the primitives read bfloat16: the quantized prefill chose its kernel by
    # row count already).
    for i, prompt in enumerate(prompts):
        alone_tokens, alone_logprobs = greedy(model, [prompt], 0)
        assert alone_tokens[0, 0] == tokens[0, i]
        # bfloat16 logits near 20 are 0.125 apart: two steps at most.
        np.testing.assert_allclose(alone_logprobs[0, 0], logprobs[0, i], rtol=0.02, atol=0.25)
    # Near the same weights with float32 activations (the floats cast up): the first
    # prompt's first token is a near tie here (-2.354 against -2.340 in float32); the
    # log-probabilities differ by at most 0.31, median 0.04-0.05.
    assert_near_the_float32_model(model, prompts, tokens, logprobs)


def test_a_bfloat16_model_runs_at_float32_speed_within_its_rounding(float_dirs, kernel):
    # Most checkpoints on the hub are bfloat16, and load keeps their dtype: every linear
    # layer and the tied LM head read the half weights (about 20 tok/s of prefill through
    # MLX's half matmul before, 350-450 now, 2-core EPYC).
    from mlx_lm_batched import load

    model, tokenizer = load(str(float_dirs["smollm2"]))
    prompts = corpus_prompts(tokenizer, (30, 52, 41))
    cast_floats(model, mx.bfloat16)
    tokens, logprobs = greedy(model, prompts, 0)
    assert_near_the_float32_model(model, prompts, tokens, logprobs)
    cast_floats(model, mx.bfloat16)
    # Speed, as a ratio in one process: a bfloat16 decode step within 2x of the float32
    # model's (MLX's half matmul took 4-15x).
    import time

    def step_seconds(m):
        engine = BatchEngine(m)
        engine.reserve(9)
        y, _ = engine.prefill(mx.array([prompts[0]]), [0])
        times = []
        for _ in range(8):
            tic = time.perf_counter()
            y, lp = engine.step(y)
            mx.eval(lp)
            times.append(time.perf_counter() - tic)
        return sorted(times)[len(times) // 2]

    half = step_seconds(model)
    cast_floats(model, mx.float32)
    assert half < 2 * step_seconds(model)
