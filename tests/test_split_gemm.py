"""A prefill's products split by output rows or columns over our threads
(``native/split_gemm.cpp``): each block one single-threaded BLAS call, taken as threads
come free; the float32 linear primitive keeps ``nn.Linear``'s bits on SmolLM2's and
Gemma-3's prefill shapes, the quantized one MLX's ``quantized_matmul`` to float32 rounding,
and OpenBLAS gets its thread count back after each split product."""

import pytest

import mlx_lm_batched  # noqa: F401  (the BLAS and the kernels load before mlx.core)
import mlx.core as mx  # noqa: E402
from mlx_lm_batched import _blas, _cpu_prims  # noqa: E402
from test_cpu_prims import kernel, pytestmark, random  # noqa: E402,F401
from test_cpu_prims_quantized import assert_close, mlx_reference  # noqa: E402


@pytest.fixture
def two_threads(kernel):
    kernel.set_threads(2)
    yield kernel
    kernel.set_threads(_cpu_prims.configured_threads())


# (rows, outputs, inputs): 256 prompt tokens through SmolLM2's query, key and MLP
# projections and its MLP's down projection, split by columns; 4096 (16 prompts) through
# its query and key projections, split by rows; Gemma-3-270M's query (640 -> 1024).
PREFILL_SHAPES = [(256, 576, 576), (256, 192, 576), (256, 1536, 576), (300, 576, 1536),
                  (4096, 576, 576), (4096, 192, 576), (256, 1024, 640)]


@pytest.mark.parametrize("rows,outputs,inputs", PREFILL_SHAPES)
def test_prefill_products_are_split_and_keep_nn_linears_bits(two_threads, rows, outputs, inputs):
    longer, shorter = max(rows, outputs), min(rows, outputs)
    assert two_threads.block_size(longer, shorter, inputs, 2) < longer  # split in blocks
    x, w, bias = random((rows, inputs), 60), random((outputs, inputs), 61), random((outputs,), 62)
    assert mx.array_equal(two_threads.linear(x, w), x @ w.T).item()
    assert mx.array_equal(two_threads.linear(x, w, bias), mx.addmm(bias, x, w.T)).item()
    strided = random((inputs, rows), 63).T  # x in columns: the BLAS reads it transposed
    assert mx.array_equal(two_threads.linear(strided, w), strided @ w.T).item()


def test_small_products_and_one_thread_are_not_split(kernel):
    # A block below about 100^3 multiply-adds would take OpenBLAS's small-matrix kernel
    # (other bits): 100 columns of 65 rows over 33 inputs stay one call, as does any
    # product on one thread.
    assert kernel.block_size(100, 65, 33, 2) == 100
    assert kernel.block_size(576, 256, 576, 1) == 576
    assert kernel.block_size(576, 256, 576, 2) == 144  # 2 blocks a thread, 16 apart
    assert kernel.block_size(4096, 576, 576, 2) == 1024
    # Row blocks keep more than 64 rows: 128 rows of 100 outputs over 2048 inputs would make
    # 4 blocks of 32, which the small-row kernel would take (other bits than the BLAS's);
    # they stay one call, with nn.Linear's bits.
    assert kernel.block_size(128, 100, 2048, 2) == 32
    assert kernel.block_size(128, 100, 2048, 2, 65) == 128
    x, w = random((128, 2048), 69), random((100, 2048), 70)
    assert mx.array_equal(kernel.linear(x, w), x @ w.T).item()


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantized_prefill_is_split_and_matches_mlx(two_threads, bits):
    wq, scales, biases = mx.quantize(random((1536, 576), 64), group_size=64, bits=bits)
    x, bias = random((256, 576), 65), random((1536,), 66)
    got = two_threads.quantized_linear(x, wq, scales, biases, bias, 64, bits)
    assert_close(got, mlx_reference(x, wq, scales, biases, 64, bits, bias))


def test_the_blas_gets_its_thread_count_back(two_threads):
    # OpenBLAS is held to one thread during a split product, then restored: the BLAS's own
    # line (its version and thread count) reads the same after as before.
    before = _blas.describe()
    x, w = random((256, 576), 67), random((1536, 576), 68)
    mx.eval(two_threads.linear(x, w))
    assert _blas.describe() == before
