"""The decode kernels' threads (``native/shared_work.cpp``): the calling thread and helpers
that join as they wake, nothing waiting for a sleeping helper. Every value must be the
one OpenMP's parallel for and one thread give (a chunk is computed as it would be alone),
whatever the thread count (more threads than cores included), over thousands of jobs in a
row and with two CPU streams calling at once; the Q4_1 GGUF decodes the same tokens and
log-probabilities either way."""

import threading

import numpy as np
import pytest

import mlx_lm_batched  # noqa: F401  (the BLAS and the kernels load before mlx.core)
import mlx.core as mx  # noqa: E402
from conftest import corpus_prompts, greedy_logprobs  # noqa: E402
from mlx_lm_batched import _cpu_prims, _small_gemm, load  # noqa: E402
from mlx_lm_batched.loading.demo_models import smollm2_gguf_path  # noqa: E402
from test_cpu_prims import kernel, pytestmark, random  # noqa: E402,F401


@pytest.fixture
def threads(kernel):
    """Set the kernels' threads and way of sharing for a test; restored after it."""
    before = _cpu_prims.configured_threads()

    def choose(count, shared=True):
        kernel.set_threads(count)
        kernel.set_shared_work(shared)

    yield choose
    kernel.set_threads(before)
    kernel.set_shared_work(True)


def decode_work(kernel, rows):
    """Quantized layers of 4, 5 and 8 bits (the AVX2 kernel's; sizes ending in partial
    blocks, one grouped call of three layers) and of 3 bits (the portable kernel), a
    bfloat16 layer and a decode attention over a padded cache, evaluated."""
    outs = [kernel.half_linear(random((rows, 576), 30), random((99, 576), 31).astype(mx.bfloat16))]
    for bits, n in ((4, 1536), (5, 99), (8, 576), (3, 203)):
        wq, s, b = mx.quantize(random((n, 576), bits), group_size=32, bits=bits)
        s, b = s.astype(mx.float16), b.astype(mx.float16)
        x = random((rows, 576), 10 + bits)
        outs.append(kernel.quantized_linear(x, wq, s, b, None, 32, bits))
        outs.extend(kernel.quantized_linears(x, [wq, wq[:40], wq[40:43]], [s, s[:40], s[40:43]],
                                             [b, b[:40], b[40:43]], [None] * 3, 32, bits))
    q, k, v = random((rows, 9, 1, 64), 1), random((rows, 3, 70, 64), 2), random((rows, 3, 70, 64), 3)
    mask = mx.arange(70)[None, :] >= mx.arange(rows)[:, None] * 7
    outs.append(kernel.decode_attention(q, k, v, 0.125, mask[:, None, None, :]))
    mx.eval(outs)
    return outs


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_every_thread_count_and_way_gives_the_bits_of_one_thread(kernel, threads, rows):
    threads(1)
    alone = decode_work(kernel, rows)
    for count, shared in ((2, True), (3, True), (2, False), (3, False)):
        threads(count, shared)
        for got, want in zip(decode_work(kernel, rows), alone):
            assert mx.array_equal(got, want).item(), (count, shared)


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_the_small_row_float32_matmul_gives_the_same_bits_every_way(kernel, threads, rows):
    # native/small_gemm.c (the float32 linear's cblas_sgemm up to 32 rows) shares its
    # panels through the primitives' helpers once they load; with them, with OpenMP
    # behind share_chunks and with its own OpenMP (no sharer) the products are equal.
    x, w = random((rows, 576), 40), random((1536, 576), 41)
    threads(2)
    shared = kernel.linear(x, w)
    threads(2, shared=False)
    openmp = kernel.linear(x, w)
    _small_gemm.share_threads_with(0)  # no sharer: the library's own parallel for
    try:
        own = kernel.linear(x, w)
        mx.eval(own)
    finally:
        _small_gemm.share_threads_with(kernel.share_chunks_address())
    before = _small_gemm.set_threads(1)  # the library's one-thread path
    try:
        alone = kernel.linear(x, w)
        mx.eval(alone)
    finally:
        assert _small_gemm.set_threads(before) == 1
    assert mx.array_equal(shared, alone).item()
    with _small_gemm.switched_off():  # the same call, to the BLAS: float32 rounding
        blas = kernel.linear(x, w)
        mx.eval(blas)
    assert mx.array_equal(shared, openmp).item() and mx.array_equal(shared, own).item()
    np.testing.assert_allclose(np.array(shared), np.array(blas), rtol=1e-4, atol=1e-4)
    assert _small_gemm.counts()[0] > 0


def test_thousands_of_jobs_in_a_row_and_two_streams_at_once(kernel, threads):
    # Jobs a few microseconds long, one after another (helpers waking late, finding a
    # job done or the next one posted), on two CPU streams' threads at once (one takes
    # the helpers, the other computes its chunks alone).
    threads(2)
    wq, s, b = mx.quantize(random((192, 576), 20), group_size=32, bits=4)
    x = random((1, 576), 21)
    want = kernel.quantized_linear(x, wq, s, b, None, 32, 4)
    mx.eval(want)
    failures = []

    def chain(count, own_stream):
        try:
            # A stream of this thread's own (MLX streams belong to the thread that made
            # them): its primitives run on that stream's thread.
            with mx.stream(mx.new_stream(mx.cpu) if own_stream else mx.default_stream(mx.cpu)):
                for _ in range(count):
                    outs = [kernel.quantized_linear(x, wq, s, b, None, 32, 4) for _ in range(20)]
                    mx.eval(outs)
                    if not all(mx.array_equal(o, want).item() for o in outs):
                        failures.append("wrong values")
        except Exception as e:  # noqa: BLE001 (reported by the assertion below)
            failures.append(repr(e))

    chain(50, own_stream=False)
    workers = [threading.Thread(target=chain, args=(50, True)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    assert not any(w.is_alive() for w in workers)
    assert not failures, failures[:3]


def test_the_q4_1_gguf_decodes_the_same_either_way(kernel, threads):
    model, tokenizer = load(smollm2_gguf_path())
    prompts = corpus_prompts(tokenizer, (30, 52, 41))
    threads(2, shared=False)
    openmp = greedy_logprobs(model, prompts, 6)
    threads(2)
    shared = greedy_logprobs(model, prompts, 6)
    threads(1)
    one = greedy_logprobs(model, prompts, 6)
    for got in (shared, one):
        assert (got[1] == openmp[1]).all()
        np.testing.assert_array_equal(got[0], openmp[0])
