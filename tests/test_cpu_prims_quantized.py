"""The quantized linear CPU primitive (``native/quantized_linear.cpp``): MLX's affine 4- and
8-bit ``quantized_matmul`` (plus a layer's bias) as one node, several times faster than
MLX's CPU loop, to float32 rounding; a row gets the same bits alone as in a decode batch;
quantized SmolLM2 decodes the same greedy tokens through it as through MLX's op."""

import numpy as np
import pytest

import mlx_lm_batched  # noqa: F401  (the BLAS and the kernels load before mlx.core)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from conftest import model_dir  # noqa: E402
from mlx_lm_batched import _cpu_prims, load  # noqa: E402
from mlx_lm_batched.layers import cpu_ops  # noqa: E402
# The kernel fixture (the built module), the seeded arrays and the decode helper.
from test_cpu_prims import decode_with_and_without, kernel, pytestmark, random  # noqa: E402,F401


def mlx_reference(x, wq, scales, biases, group, bits, bias=None):
    y = mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=group, bits=bits)
    return y if bias is None else y + bias


def assert_close(got, want):
    # Another summation order than MLX's loop: float32 rounding of the largest output.
    scale = float(mx.abs(want).max())
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=2e-6 * scale * 8)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])  # every width MLX has
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 7, 32, 40])  # the tiled kernel (<= 64 rows) and prefill
def test_matches_mlx_quantized_matmul(kernel, bits, group, rows):
    # 47 weight rows: the tiles' odd last one; 2 to 80 input rows: full tiles of 8, partial
    # ones, and past 64 the dequantized path.
    wq, scales, biases = mx.quantize(random((47, 256), 1), group_size=group, bits=bits)
    bias = random((47,), 2)
    x = random((rows, 3, 256), 3)[:, 1:]  # (rows, 2, 256), a strided view
    for b in (None, bias):
        got = kernel.quantized_linear(x, wq, scales, biases, b, group, bits)
        assert got.shape == (rows, 2, 47) and got.dtype == mx.float32
        assert_close(got, mlx_reference(x, wq, scales, biases, group, bits, b))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision_scales_are_read_as_float32(kernel, dtype):
    wq, scales, biases = mx.quantize(random((40, 128), 4).astype(dtype), group_size=64, bits=4)
    assert scales.dtype == dtype
    x = random((3, 128), 5)
    want = mlx_reference(x, wq, scales.astype(mx.float32), biases.astype(mx.float32), 64, 4)
    assert_close(kernel.quantized_linear(x, wq, scales, biases, None, 64, 4), want)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("rows", [2, 72])
def test_half_precision_inputs_are_computed_in_float32(kernel, dtype, rows):
    # A half-precision model's layer: x, scales, biases and bias in that dtype; the output
    # too, rounded once from float32 (MLX's op is the reference to half-precision rounding).
    wq, scales, biases = mx.quantize(random((40, 128), 16).astype(dtype), group_size=64, bits=4)
    x, bias = random((rows, 128), 17).astype(dtype), random((40,), 18).astype(dtype)
    got = kernel.quantized_linear(x, wq, scales, biases, bias, 64, 4)
    assert got.dtype == dtype
    exact = mlx_reference(x.astype(mx.float32), wq, scales.astype(mx.float32),
                          biases.astype(mx.float32), 64, 4, bias.astype(mx.float32))
    assert_close(got.astype(mx.float32), exact.astype(dtype).astype(mx.float32))
    half_ulp = 2.0 ** (-11 if dtype == mx.float16 else -8)
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(exact),
                               rtol=half_ulp, atol=half_ulp * float(mx.abs(exact).max()))


def test_a_view_of_a_packed_weight_is_read_as_its_rows(kernel):
    wq, scales, biases = mx.quantize(random((64, 128), 19), group_size=64, bits=4)
    x = random((3, 128), 20)
    half = slice(0, 64, 2)  # every other output row: a strided view of the packed weight
    got = kernel.quantized_linear(x, wq[half], scales[half], biases[half], None, 64, 4)
    assert_close(got, mlx_reference(x, wq, scales, biases, 64, 4)[:, half])


@pytest.mark.parametrize("bits", [3, 4, 5, 8])
def test_a_row_gets_the_same_bits_alone_and_in_a_batch(kernel, bits):
    wq, scales, biases = mx.quantize(random((96, 192), 6), group_size=64, bits=bits)
    x = random((64, 1, 192), 7)
    batch = kernel.quantized_linear(x, wq, scales, biases, None, 64, bits)
    # Tiles of 8 rows in the batch; alone, 3 and 13 rows: a row's tile differs, its bits not.
    for i in (0, 13, 31, 63):
        alone = kernel.quantized_linear(x[i:i + 1], wq, scales, biases, None, 64, bits)
        assert mx.array_equal(alone, batch[i:i + 1]).item(), i
    for start, n in ((5, 3), (40, 13)):
        some = kernel.quantized_linear(x[start:start + n], wq, scales, biases, None, 64, bits)
        assert mx.array_equal(some, batch[start:start + n]).item(), (start, n)


def pack(values, bits):
    """Integers (N, K) below 2**bits as MLX packs them: element i at bits [i * bits,
    (i + 1) * bits) of each row's little-endian stream of uint32 words."""
    per_word = 32 // bits
    n, k = values.shape
    lanes = values.astype(np.uint32).reshape(n, k // per_word, per_word)
    words = np.zeros((n, k // per_word), dtype=np.uint32)
    for t in range(per_word):
        words |= lanes[:, :, t] << np.uint32(bits * t)
    return mx.array(words)


@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_4_bit_weights_give_the_bits_of_the_same_integers_stored_in_8_bits(kernel,
                                                                            scale_dtype):
    # The decode kernel dequantizes each weight to fma(scale, q, bias) and sums in one
    # chain whatever the width; on AVX-512 builds 4-bit weights are looked up among their
    # group's 16 possible values instead of converted. The same integers stored in 8 bits
    # (the conversion path) must give the same bits, row by row, at 1 to 9 rows.
    rng = np.random.default_rng(19)
    q = rng.integers(0, 16, size=(37, 256))
    scales = (random((37, 8), 20) * 0.1).astype(scale_dtype)
    biases = (random((37, 8), 21) * 0.5).astype(scale_dtype)
    x = random((9, 256), 22)
    four = kernel.quantized_linear(x, pack(q, 4), scales, biases, None, 32, 4)
    eight = kernel.quantized_linear(x, pack(q, 8), scales, biases, None, 32, 8)
    assert mx.array_equal(four, eight).item()
    assert_close(four, mlx_reference(x, pack(q, 4), scales, biases, 32, 4))
    for rows in (slice(0, 1), slice(2, 5), slice(8, 9)):
        assert mx.array_equal(kernel.quantized_linear(x[rows], pack(q, 4), scales, biases,
                                                      None, 32, 4), four[rows]).item()


@pytest.mark.parametrize("bits", [4, 5, 8])  # the AVX2 kernel's widths
def test_one_row_with_a_bias_and_a_partial_block_gets_the_batch_bits(kernel, bits):
    # Input rows go 4 to a pass (the weights dequantized again in registers each pass), so
    # row 4 of 5 is a pass of its own; 99 outputs end in a block of 3 weight rows, and the
    # layer's bias is added last.
    wq, scales, biases = mx.quantize(random((99, 256), 8), group_size=32, bits=bits)
    scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    bias = random((99,), 9)
    x = random((5, 256), 10)
    batch = kernel.quantized_linear(x, wq, scales, biases, bias, 32, bits)
    assert_close(batch, mlx_reference(x, wq, scales, biases, 32, bits) + bias)
    for i in range(5):
        alone = kernel.quantized_linear(x[i:i + 1], wq, scales, biases, bias, 32, bits)
        assert mx.array_equal(alone, batch[i:i + 1]).item(), i
    for n in (2, 3, 4):  # one pass of n rows, 2 weight rows at a time
        some = kernel.quantized_linear(x[:n], wq, scales, biases, bias, 32, bits)
        assert mx.array_equal(some, batch[:n]).item(), n


def test_a_weight_of_many_blocks_in_the_prefill_path(kernel):
    # 1000 x 512 weight rows: the prefill path dequantizes 512 rows (1 MB) at a time into
    # its columns of the output; a bias goes into every block's columns.
    wq, scales, biases = mx.quantize(random((1000, 512), 21), group_size=64, bits=4)
    x, bias = random((70, 512), 22), random((1000,), 23)
    assert_close(kernel.quantized_linear(x, wq, scales, biases, bias, 64, 4),
                 mlx_reference(x, wq, scales, biases, 64, 4, bias))


def test_bad_arguments_get_one_clear_error(kernel):
    wq, scales, biases = mx.quantize(random((8, 64), 8), group_size=64, bits=4)
    x = random((2, 64), 9)
    with pytest.raises(ValueError, match="1, 2, 3, 4, 5, 6 or 8 bits"):
        kernel.quantized_linear(x, wq, scales, biases, None, 64, 7)
    with pytest.raises(ValueError, match="a float32, float16 or bfloat16 input"):
        kernel.quantized_linear(x.astype(mx.int32), wq, scales, biases, None, 64, 4)
    with pytest.raises(ValueError, match=r"scales and biases of shape \(N, K / group\)"):
        kernel.quantized_linear(x, wq, scales, biases, None, 32, 4)
    with pytest.raises(ValueError, match="uint32"):
        kernel.quantized_linear(random((2, 128), 10), wq, scales, biases, None, 64, 4)


def test_layers_route_quantized_linears_and_embeddings_through_it(kernel):
    layer = nn.QuantizedLinear.from_linear(nn.Linear(64, 32, bias=True), group_size=32, bits=4)
    x = random((2, 1, 64), 11)
    out = cpu_ops.linear(layer, x)
    mine = kernel.quantized_linear(x, layer.weight, layer.scales, layer.biases, layer.bias, 32, 4)
    assert mx.array_equal(out, mine).item()
    assert_close(out, layer(x))
    embedding = nn.QuantizedEmbedding.from_embedding(nn.Embedding(50, 64), group_size=64, bits=8)
    logits = cpu_ops.tied_logits(embedding, x)
    assert mx.array_equal(logits, kernel.quantized_linear(
        x, embedding.weight, embedding.scales, embedding.biases, None, 64, 8)).item()
    assert_close(logits, embedding.as_linear(x))
    # Primitives off: the layer as it is, MLX's bits.
    with _cpu_prims.switched_off():
        assert mx.array_equal(cpu_ops.linear(layer, x), layer(x)).item()


def test_gradients_with_respect_to_the_input_match_mlx(kernel):
    wq, scales, biases = mx.quantize(random((24, 64), 12), group_size=32, bits=4)
    bias, x, cot = random((24,), 13), random((3, 64), 14), random((3, 24), 15)
    got = mx.vjp(lambda x, b: kernel.quantized_linear(x, wq, scales, biases, b, 32, 4),
                 [x, bias], [cot])[1]
    want = mx.vjp(lambda x, b: mlx_reference(x, wq, scales, biases, 32, 4, b),
                  [x, bias], [cot])[1]
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-5)


def test_quantized_smollm2_decodes_through_it_as_with_mlx_ops(kernel, monkeypatch):
    """SmolLM2 quantized to 4 bits with float32 scales (the float32 model quantized):
    greedy decoding of a padded batch gives MLX's op's tokens, log-probabilities within
    float32 rounding through 30 layers, and every projection goes through the kernel."""
    model, tokenizer = load(str(model_dir("smollm2", dtype="float32", quantize=True,
                                          q_bits=4, q_group_size=64)))
    assert isinstance(model.model.layers[0].mlp.gate_proj, nn.QuantizedLinear)
    grouped = []
    linears = _cpu_prims.quantized_linears
    monkeypatch.setattr(_cpu_prims, "quantized_linears", lambda x, layers: grouped.append(
        (x.shape, len(layers))) or linears(x, layers))
    calls, (ours, our_tokens), (theirs, their_tokens) = decode_with_and_without(
        model, tokenizer, monkeypatch, "quantized_linear")
    # 7 projections per layer and the tied LM head, at each of the 7 one-column calls: the
    # output and down projections and the head alone, the query, key and value projections
    # in one node, the gate and up ones in another.
    n = len(model.layers)
    assert sum(shape[:2] == (3, 1) for shape in calls) == 7 * (2 * n + 1)
    assert sorted(size for shape, size in grouped if shape[:2] == (3, 1)) == [2] * 7 * n + [3] * 7 * n
    assert (our_tokens == their_tokens).all()
    assert float(np.abs(ours - theirs).max()) < 1e-3
