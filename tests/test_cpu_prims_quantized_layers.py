"""Several quantized layers of one input as one primitive (``quantized_linears``: a decode
step's query, key and value projections, a gated MLP's gate and up): every output has the
bits the layer gets alone, whatever the rows, the layers' sizes, biases and scale dtypes;
gradients are MLX's; the shared layers route their projections through it."""

import numpy as np
import pytest

import mlx_lm_batched  # noqa: F401  (the BLAS and the kernels load before mlx.core)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm_batched import _cpu_prims  # noqa: E402
from mlx_lm_batched.layers import cpu_ops  # noqa: E402
from mlx_lm_batched.layers.attention import Attention  # noqa: E402
from mlx_lm_batched.layers.mlp import MLP  # noqa: E402
from test_cpu_prims import kernel, pytestmark, random  # noqa: E402,F401


def quantized(n, k, seed, bits, group=32, dtype=mx.float32):
    wq, scales, biases = mx.quantize(random((n, k), seed), group_size=group, bits=bits)
    return wq, scales.astype(dtype), biases.astype(dtype)


@pytest.mark.parametrize("bits", [3, 4, 5, 8])  # the AVX2 kernel's widths and a portable one
@pytest.mark.parametrize("rows", [1, 3, 5, 64, 70])  # decode passes of 4, the tiled path, prefill
def test_each_output_has_the_bits_of_its_layer_alone(kernel, bits, rows):
    # Sizes that end in partial blocks of weight rows (99, 6) and one layer with a bias.
    layers = [quantized(99, 128, 1, bits), quantized(32, 128, 2, bits), quantized(6, 128, 3, bits)]
    bias = [None, random((32,), 4), None]
    x = random((rows, 128), 5)
    outs = kernel.quantized_linears(x, *[list(p) for p in zip(*layers)], bias, 32, bits)
    assert [o.shape for o in outs] == [(rows, 99), (rows, 32), (rows, 6)]
    for out, (wq, s, b), c in zip(outs, layers, bias):
        assert mx.array_equal(out, kernel.quantized_linear(x, wq, s, b, c, 32, bits)).item()


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_layers_whose_scales_differ_in_dtype_each_get_their_own_bits(kernel, dtype):
    # The kernel takes one scale dtype per call: such layers are computed one at a time.
    layers = [quantized(40, 64, 6, 4, dtype=dtype), quantized(24, 64, 7, 4)]
    x = random((2, 1, 64), 8)
    outs = kernel.quantized_linears(x, *[list(p) for p in zip(*layers)], [None, None], 32, 4)
    for out, (wq, s, b) in zip(outs, layers):
        assert mx.array_equal(out, kernel.quantized_linear(x, wq, s, b, None, 32, 4)).item()


def test_half_precision_input_gives_outputs_of_its_dtype(kernel):
    layers = [quantized(16, 64, 9, 4, dtype=mx.bfloat16), quantized(8, 64, 10, 4, dtype=mx.bfloat16)]
    x = random((3, 64), 11).astype(mx.bfloat16)
    outs = kernel.quantized_linears(x, *[list(p) for p in zip(*layers)], [None, None], 32, 4)
    for out, (wq, s, b) in zip(outs, layers):
        assert out.dtype == mx.bfloat16
        assert mx.array_equal(out, kernel.quantized_linear(x, wq, s, b, None, 32, 4)).item()


def test_gradients_with_respect_to_the_input_and_biases_match_mlx(kernel):
    (w1, s1, b1), (w2, s2, b2) = quantized(24, 64, 12, 4), quantized(10, 64, 13, 4)
    bias, x = random((10,), 14), random((3, 64), 15)
    cots = [random((3, 24), 16), random((3, 10), 17)]

    def ours(x, bias):
        return kernel.quantized_linears(x, [w1, w2], [s1, s2], [b1, b2], [None, bias], 32, 4)

    def reference(x, bias):
        q = lambda w, s, b: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=32, bits=4)
        return [q(w1, s1, b1), q(w2, s2, b2) + bias]

    got = mx.vjp(ours, [x, bias], cots)[1]
    want = mx.vjp(reference, [x, bias], cots)[1]
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-5)


def test_bad_arguments_get_one_clear_error(kernel):
    wq, scales, biases = quantized(8, 64, 18, 4)
    x = random((2, 64), 19)
    with pytest.raises(ValueError, match="one scales, biases and bias per weight"):
        kernel.quantized_linears(x, [wq, wq], [scales], [biases], [None, None], 32, 4)
    with pytest.raises(ValueError, match=r"scales and biases of shape \(N, K / group\)"):
        kernel.quantized_linears(x, [wq, wq], [scales, scales[:4]], [biases, biases], [None, None],
                                 32, 4)


def test_cpu_ops_groups_quantized_layers_of_one_width_and_falls_back_otherwise(kernel,
                                                                             monkeypatch):
    linear = lambda n, bits, bias=False: nn.QuantizedLinear.from_linear(
        nn.Linear(64, n, bias=bias), group_size=32, bits=bits)
    x = random((2, 1, 64), 20)
    calls = []
    grouped = _cpu_prims.quantized_linears
    monkeypatch.setattr(_cpu_prims, "quantized_linears",
                        lambda x, layers: calls.append(len(layers)) or grouped(x, layers))
    same = [linear(48, 4), linear(16, 4, bias=True), linear(16, 4)]
    for out, layer in zip(cpu_ops.linears(same, x), same):
        assert mx.array_equal(out, cpu_ops.linear(layer, x)).item()
    assert calls == [3]
    # Another width among them (mlx-lm's mixed recipes): the primitive declines, each
    # layer alone; a float layer among them never reaches it.
    mixed = [linear(48, 4), linear(16, 8)]
    for out, layer in zip(cpu_ops.linears(mixed, x), mixed):
        assert mx.array_equal(out, cpu_ops.linear(layer, x)).item()
    floats = [nn.Linear(64, 8), linear(16, 4)]
    for out, layer in zip(cpu_ops.linears(floats, x), floats):
        assert mx.array_equal(out, cpu_ops.linear(layer, x)).item()
    assert calls == [3, 2]


def test_attention_and_mlp_project_in_one_node_with_the_bits_of_separate_layers(kernel,
                                                                               monkeypatch):
    attention = Attention(64, 4, 2, 16)
    mlp = MLP(64, 96)
    nn.quantize(attention, group_size=32, bits=4)
    nn.quantize(mlp, group_size=32, bits=4)
    x = random((3, 1, 64), 21)
    calls = []
    grouped = _cpu_prims.quantized_linears
    monkeypatch.setattr(_cpu_prims, "quantized_linears",
                        lambda x, layers: calls.append(len(layers)) or grouped(x, layers))
    q, k, v = attention.project(x)
    hidden = mlp(x)
    assert calls == [3, 2]  # the query, key and value projections; the gate and up ones
    monkeypatch.undo()
    for got, layer in ((q, attention.q_proj), (k, attention.k_proj), (v, attention.v_proj)):
        assert mx.array_equal(got, cpu_ops.linear(layer, x)).item()
    alone = cpu_ops.linear(mlp.down_proj, cpu_ops.swiglu(cpu_ops.linear(mlp.gate_proj, x),
                                                         cpu_ops.linear(mlp.up_proj, x)))
    assert mx.array_equal(hidden, alone).item()
