"""Our CPU primitives (``mlx_lm_batched/_cpu_prims.py``, ``native/*.cpp``): decode
attention, RMSNorm, RoPE, linear layers and SwiGLU as one MLX primitive each, built as
a C++ MLX extension with the system's compiler.

Attention must match a float64 reference (GQA, padding, sliding-window holes, strided
views of a cache, head sizes off the 16-lane width), and a row must get the same bits
alone as in a batch with other rows and more padding, whatever the thread count; RMSNorm
and RoPE must match ``mx.fast``'s CPU fallbacks (strided inputs, partial and traditional
rotation, per-row offsets) with a row's bits independent of the other rows; a linear
layer must give ``nn.Linear``'s very bits (the same BLAS call), SwiGLU cpu_ops' bits;
real models must decode through them with the tokens and log-probabilities of MLX's
ops; and the switch and build failures must leave everything to MLX's ops with one line
saying why.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import mlx_lm_batched  # noqa: F401  (the BLAS and the kernels load before mlx.core)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from conftest import corpus_prompts, greedy_logprobs  # noqa: E402
from mlx_lm_batched import _cpu_prims, _small_gemm  # noqa: E402
from mlx_lm_batched.engine.batch_engine import BatchEngine  # noqa: E402
from mlx_lm_batched.layers import cpu_ops  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the kernel is built on Linux (the CPU backend's)")


@pytest.fixture(scope="module")
def kernel():
    module = _cpu_prims.module()
    assert module is not None, _cpu_prims.problem
    return module


def reference(q, k, v, scale, mask):
    """float64 attention with numpy: q (B, H, 1, D), k/v (B, n_kv, S, D)."""
    q, k, v = (np.array(a).astype(np.float64) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = (q * scale) @ k.swapaxes(-1, -2)
    if mask is not None:
        scores = np.where(np.array(mask), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v


def random(shape, seed):
    return mx.random.normal(shape, key=mx.random.key(seed))


@pytest.mark.parametrize("B,H,n_kv,S,D,Dv", [(1, 9, 3, 7, 64, 64), (5, 4, 1, 33, 80, 80),
                                             (3, 8, 8, 20, 24, 40), (2, 6, 2, 129, 128, 128)])
def test_values_match_a_float64_reference(kernel, B, H, n_kv, S, D, Dv):
    q, k, v = random((B, H, 1, D), 1) * 2, random((B, n_kv, S, D), 2), random((B, n_kv, S, Dv), 3)
    slots = np.arange(S)
    padding = np.array([(3 * b) % (S // 2 + 1) for b in range(B)])
    masks = {
        "none": None,
        "left padding": mx.array(slots[None] >= padding[:, None])[:, None, None],
        # A sliding window with holes (Gemma 3's local layers), shared by the rows.
        "window": mx.array((slots % 5 != 1) & (slots > 1))[None, None, None],
        "2-D": mx.array(slots >= 2)[None],
    }
    for name, mask in masks.items():
        got = kernel.decode_attention(q, k, v, 0.3, mask)
        want = reference(q, k, v, 0.3, mask)
        np.testing.assert_allclose(np.array(got), want, rtol=2e-5, atol=2e-6, err_msg=name)


def test_strided_views_of_a_cache_are_read_in_place(kernel):
    # A cache's keys are views: a slice of slots, heads transposed, a feature stride.
    base = random((2, 40, 3, 32), 4)
    k = base.transpose(0, 2, 1, 3)[:, :, 5:]  # (2, 3, 35, 32), slots strided
    v = random((2, 3, 35, 64), 5)[..., ::2]  # features with stride 2
    q = random((2, 6, 1, 32), 6)
    got = kernel.decode_attention(q, k, v, 0.2, None)
    np.testing.assert_allclose(np.array(got), reference(q, k, v, 0.2, None),
                               rtol=2e-5, atol=2e-6)


def test_a_row_gets_the_same_bits_alone_and_in_a_padded_batch(kernel):
    # Row 0 alone over its 50 keys, and as row 2 of 4 behind 30 slots of padding while
    # the other rows attend more keys: masked slots are skipped, not summed as zeros.
    q, k, v = random((1, 9, 1, 64), 7), random((1, 3, 50, 64), 8), random((1, 3, 50, 64), 9)
    alone = kernel.decode_attention(q, k, v, 0.125, None)
    others_k, others_v = random((4, 3, 80, 64), 10), random((4, 3, 80, 64), 11)
    batch_k = mx.concatenate([others_k[:2], mx.concatenate(
        [others_k[2:3, :, :30], k], axis=2), others_k[3:]])
    batch_v = mx.concatenate([others_v[:2], mx.concatenate(
        [others_v[2:3, :, :30], v], axis=2), others_v[3:]])
    batch_q = mx.concatenate([random((2, 9, 1, 64), 12), q, random((1, 9, 1, 64), 13)])
    mask = mx.array(np.arange(80)[None] >= np.array([0, 10, 30, 5])[:, None])[:, None, None]
    batched = kernel.decode_attention(batch_q, batch_k, batch_v, 0.125, mask)
    assert mx.array_equal(batched[2:3], alone).item()
    # ...and the same bits on one thread as on several.
    kernel.set_threads(1)
    try:
        assert mx.array_equal(kernel.decode_attention(batch_q, batch_k, batch_v, 0.125, mask),
                              batched).item()
    finally:
        kernel.set_threads(_cpu_prims.configured_threads())


def test_bad_arguments_get_one_clear_error(kernel):
    q, k = random((2, 4, 1, 16), 1), random((2, 2, 9, 16), 2)
    with pytest.raises(ValueError, match="one dtype"):
        kernel.decode_attention(q.astype(mx.float16), k, k, 1.0, None)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        kernel.decode_attention(*(a.astype(mx.int32) for a in (q, k, k)), 1.0, None)
    with pytest.raises(ValueError, match="shapes disagree"):
        kernel.decode_attention(q, k, k[:, :, :4], 1.0, None)
    with pytest.raises(ValueError, match="boolean"):
        kernel.decode_attention(q, k, k, 1.0, mx.zeros((2, 1, 1, 9)))


@pytest.mark.parametrize("D", [64, 40, 7])
def test_rms_norm_matches_mlx_and_keeps_a_rows_bits(kernel, D):
    x = random((6, 3, D), 20) * 3
    w = random((D,), 21)
    for weight in (w, None):
        got = kernel.rms_norm(x, weight, 1e-5)
        np.testing.assert_allclose(np.array(got), np.array(mx.fast.rms_norm(x, weight, 1e-5)),
                                   rtol=2e-6, atol=2e-6)
        assert mx.array_equal(kernel.rms_norm(x[2:3], weight, 1e-5), got[2:3]).item()
    # A transposed (strided) input reads in place; a strided weight too.
    xt = random((D, 5), 22).T
    np.testing.assert_allclose(np.array(kernel.rms_norm(xt, w[::-1], 1e-6)),
                               np.array(mx.fast.rms_norm(xt, w[::-1], 1e-6)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dims,traditional", [(64, False), (32, False), (64, True), (16, True)])
def test_rope_matches_mlx_with_per_row_offsets(kernel, dims, traditional):
    # (B, L, heads, D) transposed to (B, heads, L, D): the strided view attention hands it.
    x = random((3, 5, 4, 64), 30).transpose(0, 2, 1, 3)
    offset = mx.array([0, 9, -3], dtype=mx.int32)
    for base, freqs, scale in ((10000.0, None, 1.0), (500000.0, None, 0.25),
                               (None, mx.arange(1, dims // 2 + 1, dtype=mx.float32) ** 1.5, 1.0)):
        inv = (1.0 / freqs) if freqs is not None else _cpu_prims.inverse_frequencies(dims, base)
        got = kernel.rope(x, dims, traditional, inv, scale, offset)
        want = mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale,
                            offset=offset, freqs=freqs)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=2e-5)
        # Row 1 alone (its own offset) gets the bits it gets in the batch.
        alone = kernel.rope(x[1:2], dims, traditional, inv, scale, offset[1:2])
        assert mx.array_equal(alone, got[1:2]).item()
    with pytest.raises(ValueError, match="dims must be even"):
        kernel.rope(x, 7, False, inv, 1.0, offset)


@pytest.mark.parametrize("rows", [1, 7, 32, 45])
def test_linear_gives_nn_linears_bits(kernel, rows):
    # The same BLAS call as MLX's matmul: the same bits as nn.Linear, whether our
    # small-row kernel (up to 32 rows) or the BLAS (more) computes it, with and without
    # a bias, on a strided input and a transposed weight (both copied, as MLX does).
    layer = nn.Linear(40, 24, bias=True)
    layer.update({"weight": random((24, 40), 50), "bias": random((24,), 51)})
    x = random((rows, 3, 40), 52)[:, 1:]  # (rows, 2, 40), a strided view
    mx.eval(x)
    served = _small_gemm.counts()[0]
    ours = [kernel.linear(x, layer.weight, layer.bias), kernel.linear(x, layer.weight)]
    mx.eval(ours)
    if 2 * rows <= _small_gemm.max_rows:  # our kernel computed both products
        assert _small_gemm.counts()[0] == served + 2
    assert mx.array_equal(ours[0], layer(x)).item()
    assert mx.array_equal(ours[1], x @ layer.weight.T).item()
    transposed = random((40, 24), 53).T
    assert mx.array_equal(kernel.linear(x, transposed), x @ transposed.T).item()
    # A row alone gets its bits in the batch wherever the small-row kernel serves both.
    if 2 * rows <= _small_gemm.max_rows:
        assert mx.array_equal(kernel.linear(x[-1:], layer.weight), (x @ layer.weight.T)[-1:]).item()
    with pytest.raises(ValueError, match=r"the weight must be \(N, K\)"):
        kernel.linear(x, layer.weight.T)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(x.astype(mx.float16), layer.weight)


def test_layers_route_plain_linears_through_it(kernel):
    # cpu_ops.linear: a plain nn.Linear becomes one graph node with its own bits (quantized
    # layers have their own primitive: test_cpu_prims_quantized.py).
    layer = nn.Linear(64, 32, bias=False)
    x = random((2, 1, 64), 54)
    out = cpu_ops.linear(layer, x)
    assert mx.array_equal(out, layer(x)).item()
    embedding = nn.Embedding(50, 64)
    assert mx.array_equal(cpu_ops.tied_logits(embedding, x), embedding.as_linear(x)).item()
    with _cpu_prims.switched_off():
        assert mx.array_equal(cpu_ops.linear(layer, x), out).item()


def test_swiglu_matches_the_composed_formula(kernel):
    # One node for silu(gate) * up with cpu_ops' exp formula: its very bits (no fused
    # multiply-add the formula does not write), on contiguous operands and on the strided
    # halves of a fused gate_up projection, from large negative to large positive gates;
    # each element depends on its own.
    gate, up = random((3, 5, 1536), 60) * 30, random((3, 5, 1536), 61)
    got = kernel.swiglu(gate, up)
    assert mx.array_equal(got, cpu_ops.silu(gate) * up).item()
    g64 = np.array(gate).astype(np.float64)
    np.testing.assert_allclose(np.array(got), g64 / (1 + np.exp(-g64)) * np.array(up),
                               rtol=1e-5, atol=1e-6)
    assert mx.array_equal(kernel.swiglu(gate[1:2, 3:], up[1:2, 3:]), got[1:2, 3:]).item()
    gate_up = random((2, 1, 3072), 62) * 5
    g, u = mx.split(gate_up, 2, axis=-1)
    assert mx.array_equal(kernel.swiglu(g, u),
                          kernel.swiglu(mx.contiguous(g), mx.contiguous(u))).item()
    with pytest.raises(ValueError, match="same shape"):
        kernel.swiglu(gate, up[:, :2])


def test_gradients_match_mlx_ops(kernel):
    # Training on the CPU differentiates through the primitives: their vjps must be
    # those of the functions they replace.
    x, w, cot = random((2, 3, 5, 32), 40), random((32,), 41), random((2, 3, 5, 32), 42)
    offset = mx.array([4, -1], dtype=mx.int32)
    inv = _cpu_prims.inverse_frequencies(32, 10000.0)
    weight, bias = random((24, 32), 47), random((24,), 48)
    pairs = [
        (lambda x, w: kernel.rms_norm(x, w, 1e-5), lambda x, w: mx.fast.rms_norm(x, w, 1e-5)),
        (lambda x, w: kernel.swiglu(x, x * w), lambda x, w: x * mx.sigmoid(x) * (x * w)),
        (lambda x, w: kernel.linear(x * w, weight, bias).sum(-1, keepdims=True) * x,
         lambda x, w: mx.addmm(bias, x * w, weight.T).sum(-1, keepdims=True) * x),
        (lambda x, w: kernel.rope(x, 32, False, inv, 1.0, offset) * w,
         lambda x, w: mx.fast.rope(x, 32, traditional=False, base=10000.0, scale=1.0,
                                   offset=offset) * w),
    ]
    for ours, theirs in pairs:
        got = mx.vjp(ours, [x, w], [cot])[1]
        want = mx.vjp(theirs, [x, w], [cot])[1]
        for g, r in zip(got, want):
            np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-5)
    q, k, v = random((2, 4, 1, 16), 43), random((2, 2, 9, 16), 44), random((2, 2, 9, 16), 45)
    mask = mx.array(np.arange(9)[None] >= np.array([0, 3])[:, None])[:, None, None]

    def composed(q, k, v):
        scores = (q * 0.25) @ mx.repeat(k, 2, axis=1).swapaxes(-1, -2)
        scores = mx.where(mask, scores, -mx.inf)
        return mx.softmax(scores, axis=-1, precise=True) @ mx.repeat(v, 2, axis=1)

    cot = random((2, 4, 1, 16), 46)
    got = mx.vjp(lambda q, k, v: kernel.decode_attention(q, k, v, 0.25, mask), [q, k, v], [cot])[1]
    want = mx.vjp(composed, [q, k, v], [cot])[1]
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-5)


def decode_with_and_without(model, tokenizer, monkeypatch, primitive):
    """Greedy decoding (6 steps) of a padded batch of 3 corpus prompts with our primitives
    and with MLX's ops: ``(shapes of the first argument of every call of _cpu_prims'
    function ``primitive``, (logprobs, tokens) ours, (logprobs, tokens) MLX's ops)``."""
    prompts = corpus_prompts(tokenizer, (30, 52, 41))
    calls = []
    function = getattr(_cpu_prims, primitive)
    monkeypatch.setattr(_cpu_prims, primitive,
                        lambda *a: calls.append(a[0].shape) or function(*a))
    ours = greedy_logprobs(model, prompts, 6)
    monkeypatch.undo()
    with _cpu_prims.switched_off():
        return calls, ours, greedy_logprobs(model, prompts, 6)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_models_decode_through_it_as_with_mlx_ops(float_models, kernel, monkeypatch, name):
    model, tokenizer = float_models[name]
    calls, (fused, fused_tokens), (ops, ops_tokens) = decode_with_and_without(
        model, tokenizer, monkeypatch, "attend")
    # Every layer of every one-column call of the batch: the prefill's last column
    # (fed alone, as mlx-lm's) and the 6 decode steps.
    assert sum(shape[0] == 3 for shape in calls) == 7 * len(model.layers)
    assert (fused_tokens == ops_tokens).all()
    assert float(np.abs(fused - ops).max()) < 1e-4


def run_probe(tmp_path, **env):
    """A fresh process that decodes with SmolLM2 and prints the kernel's state."""
    code = (
        "import mlx_lm_batched, mlx.core as mx\n"
        "from mlx_lm_batched import _cpu_prims as d\n"
        "from mlx_lm_batched.layers import cpu_ops\n"
        "q = mx.random.normal((2, 4, 1, 16)); k = mx.random.normal((2, 2, 9, 16))\n"
        "out = cpu_ops.attention(q, k, k, 0.25)\n"
        "print(d.describe()); print(out.shape)\n"
    )
    clean = {k: v for k, v in os.environ.items()
             if k not in (_cpu_prims.ENV, "CXX", "XDG_CACHE_HOME")}
    clean.update(env)
    return subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True,
                          text=True, timeout=300)


def test_switched_off_it_leaves_attention_to_mlx_ops(tmp_path):
    done = run_probe(tmp_path, **{_cpu_prims.ENV: "off"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["CPU primitives off", "(2, 4, 1, 16)"]
    bad = run_probe(tmp_path, **{_cpu_prims.ENV: "maybe"})
    assert bad.returncode != 0
    assert "MLX_LM_BATCHED_CPU_PRIMITIVES='maybe': expected auto, on, 1, off or 0" in bad.stderr


def test_without_a_compiler_attention_still_works_and_says_why(tmp_path):
    done = run_probe(tmp_path, CXX=str(tmp_path / "no-such-c++"), XDG_CACHE_HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "CPU primitives not built: OSError: no C++ compiler (c++) to build the CPU "
        "primitives", "(2, 4, 1, 16)"]
    # and the user hears it once, on stderr (decoding works, only slower)
    assert done.stderr.count("CPU primitives not built, MLX's ops serve (slower decode): "
                             "OSError: no C++ compiler (c++)") == 1
