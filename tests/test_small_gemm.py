"""Our small-row matmul kernel (``mlx_lm_batched/_small_gemm.py``,
``native/small_gemm.c``): MLX's CPU matmuls of at most a few rows, ``x @ W.T``, computed
by our own ``cblas_sgemm`` ahead of the BLAS.

It is built with the system's C compiler and loaded before the BLAS; every value must
match a float64 reference, a row must get the same bits alone as among other rows and
whatever the thread count, calls it does not serve must reach the BLAS, and the
switches must do what they say.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mlx_lm_batched  # noqa: F401  (the BLAS and the kernel load before mlx.core)
import mlx.core as mx  # noqa: E402
from mlx_lm_batched import _blas, _small_gemm  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the kernel is loaded with the BLAS preload (Linux)")

ENV_VARS = (_small_gemm.ENV, _small_gemm.ROWS_ENV, _small_gemm.THREADS_ENV, "CC",
            "MLX_LM_BATCHED_BLAS", "MLX_LM_BATCHED_NO_OPENBLAS")


def clean_env(**overrides):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(overrides)
    return env


def product(a, w):
    with mx.stream(mx.cpu):
        return np.array(mx.array(a) @ mx.array(w).T)


@pytest.fixture
def serve_up_to():
    """Set the kernel's row limit for one test, then restore it."""
    previous = _small_gemm.max_rows

    def set_rows(rows):
        _small_gemm.set_max_rows(rows)

    yield set_rows
    _small_gemm.set_max_rows(previous)


def test_installed_and_named_where_a_compiler_and_a_blas_are():
    if shutil.which(os.environ.get("CC", "cc")) is None or _blas.loaded_path is None:
        # Without either, every matmul stays with the BLAS, and describe() says why.
        assert _small_gemm.max_rows == 0
        return
    assert _small_gemm.problem is None
    assert _small_gemm.max_rows == int(os.environ.get(_small_gemm.ROWS_ENV, _small_gemm.DEFAULT_MAX_ROWS))
    assert _small_gemm.threads == (int(os.environ.get(_small_gemm.THREADS_ENV, "0"))
                                   or _small_gemm.default_threads())
    assert f"small-row kernel <= {_small_gemm.max_rows} rows" in _blas.describe()


@pytest.mark.parametrize("K", [1, 15, 16, 17, 64, 200, 576])
def test_values_match_float64_for_every_block_shape(serve_up_to, K):
    # Rows 1..19 and 64 cover the 8x3 blocks and the 4x4, 2x8 and 1x8 ones for the rows
    # left over (AVX-512; on AVX2 the 4x1 blocks and the 2x2 and 1x3 ones); N values
    # cover partial blocks of B's rows; K the 16-lane tail.
    serve_up_to(64)
    rng = np.random.default_rng(K)
    for N in (1, 5, 23, 100, 1537):
        w = rng.standard_normal((N, K), dtype=np.float32)
        for M in list(range(1, 20)) + [64]:
            a = rng.standard_normal((M, K), dtype=np.float32)
            served = _small_gemm.counts()[0]
            got = product(a, w)
            if N * K > 1:  # (a 1x1 B is contiguous both ways: MLX passes it untransposed)
                assert _small_gemm.counts()[0] == served + 1, (M, N, K)
            want = a.astype(np.float64) @ w.astype(np.float64).T
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(K))


def test_alpha_beta_and_strided_inputs(serve_up_to):
    serve_up_to(64)
    rng = np.random.default_rng(1)
    wide = rng.standard_normal((12, 300), dtype=np.float32)
    w = rng.standard_normal((40, 260), dtype=np.float32)
    c = rng.standard_normal((12, 40), dtype=np.float32)
    with mx.stream(mx.cpu):
        a = mx.array(wide)[:, 20:280]  # rows 300 floats apart: lda > K
        served = _small_gemm.counts()[0]
        got = np.array(mx.addmm(mx.array(c), a, mx.array(w).T, alpha=0.5, beta=2.0))
        assert _small_gemm.counts()[0] > served
    want = 0.5 * (wide[:, 20:280].astype(np.float64) @ w.T.astype(np.float64)) + 2.0 * c
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_row_gets_the_same_bits_alone_and_among_others(serve_up_to):
    serve_up_to(64)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((1537, 576), dtype=np.float32)
    rows = rng.standard_normal((64, 576), dtype=np.float32)
    alone = np.concatenate([product(rows[i:i + 1], w) for i in range(64)])
    for M in (2, 3, 5, 8, 9, 13, 17, 31, 64):
        assert np.array_equal(product(rows[:M], w), alone[:M]), M
    # The same row at every position of a block of 8, and in the leftover blocks.
    shuffled = rows[::-1].copy()
    assert np.array_equal(product(shuffled[:27], w), alone[::-1][:27])


def test_a_row_with_a_bias_gets_the_same_bits_alone_and_among_others(serve_up_to):
    """``addmm`` (C is passed to the kernel with beta) gives a row the same bits in every
    block shape for any alpha and beta: the beta term is one explicit fused multiply-add,
    not left to where the compiler inlined the store (with alpha 0.7 and beta 0.3 rows
    differed alone and among others before; alpha = beta = 1, a linear layer's bias,
    did not)."""
    serve_up_to(64)
    rng = np.random.default_rng(3)
    for K in (17, 576):
        w = mx.array(rng.standard_normal((203, K), dtype=np.float32))
        bias = mx.array(rng.standard_normal((203,), dtype=np.float32))
        rows = mx.array(rng.standard_normal((32, K), dtype=np.float32))
        with mx.stream(mx.cpu):
            for alpha, beta in ((1.0, 1.0), (0.7, 0.3)):
                alone = [np.array(mx.addmm(bias, rows[i:i + 1], w.T, alpha=alpha, beta=beta))
                         for i in range(32)]
                for M in (2, 3, 4, 5, 7, 8, 13, 32):
                    got = np.array(mx.addmm(bias, rows[:M], w.T, alpha=alpha, beta=beta))
                    assert np.array_equal(got, np.concatenate(alone[:M])), (K, M, alpha)


THREADS_PROBE = r'''
import sys, numpy as np
import mlx_lm_batched, mlx_lm_batched._small_gemm as g
import mlx.core as mx
rng = np.random.default_rng(3)
w = rng.standard_normal((1537, 576), dtype=np.float32)
a = rng.standard_normal((8, 576), dtype=np.float32)
with mx.stream(mx.cpu):
    out = np.array(mx.array(a) @ mx.array(w).T)
assert g.counts()[0] >= 1, g.describe()
sys.stdout.write(out.tobytes().hex())
'''


def test_the_thread_count_does_not_change_a_bit():
    outs = {}
    for threads in ("1", "2", "3"):
        proc = subprocess.run([sys.executable, "-c", THREADS_PROBE], capture_output=True,
                              text=True, timeout=300,
                              env=clean_env(**{_small_gemm.THREADS_ENV: threads}))
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs[threads] = proc.stdout
    assert outs["1"] == outs["2"] == outs["3"]


TEAM_PROBE = r'''
import json, os
import numpy as np
import mlx_lm_batched
import mlx.core as mx
from mlx_lm_batched import _small_gemm as g
before = g.team_thread_ids()
rng = np.random.default_rng(0)
a = rng.standard_normal((4, 576), dtype=np.float32)
w = rng.standard_normal((1536, 576), dtype=np.float32)
with mx.stream(mx.cpu):
    mx.eval(mx.array(a) @ mx.array(w).T)
print(json.dumps({"before": before, "after": g.team_thread_ids(), "pid": os.getpid(),
                  "tasks": sorted(int(t) for t in os.listdir("/proc/self/task"))}))
'''


def test_the_threads_that_computed_are_named_for_profilers():
    """``team_thread_ids``: nothing before the first product, then MLX's stream thread
    (the caller) and the kernel's worker, both live threads of the process and neither
    the Python thread (what ``scripts/profile_decode.py`` splits CPU time by)."""
    if _small_gemm.max_rows == 0:
        pytest.skip(f"kernel not built here: {_small_gemm.describe()}")
    proc = subprocess.run([sys.executable, "-c", TEAM_PROBE], capture_output=True, text=True,
                          timeout=300, env=clean_env(**{_small_gemm.THREADS_ENV: "2"}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout)
    assert seen["before"] == []
    caller, *workers = seen["after"]
    assert len(workers) == 1
    assert {caller, *workers} <= set(seen["tasks"])
    assert seen["pid"] not in seen["after"]


def test_larger_calls_and_other_layouts_reach_the_blas(serve_up_to):
    serve_up_to(8)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((70, 33), dtype=np.float32)
    a = rng.standard_normal((9, 33), dtype=np.float32)
    served, passed = _small_gemm.counts()
    got = product(a, w)  # 9 rows: over the limit
    with mx.stream(mx.cpu):
        plain = np.array(mx.array(a[:4]) @ mx.array(w[:, :33].T.copy()))  # A @ B, no transpose
    assert _small_gemm.counts() == (served, passed + 2)
    np.testing.assert_allclose(got, a.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(plain, a[:4].astype(np.float64) @ w.T, rtol=1e-5, atol=1e-4)
    with _small_gemm.switched_off():
        product(a[:2], w)
    assert _small_gemm.counts() == (served, passed + 3)
    assert _small_gemm.max_rows == 8


SWITCH_PROBE = r'''
import json, numpy as np
import mlx_lm_batched, mlx_lm_batched._blas as b, mlx_lm_batched._small_gemm as g
import mlx.core as mx
with mx.stream(mx.cpu):
    x = (mx.array(np.arange(12, dtype=np.float32).reshape(2, 6))
         @ mx.array(np.ones((3, 6), dtype=np.float32)).T)
    mx.eval(x)
print(json.dumps({"describe": b.describe(), "counts": g.counts(), "rows": g.max_rows,
                  "x": np.array(x).tolist()}))
'''


def run_switch_probe(**env):
    proc = subprocess.run([sys.executable, "-c", SWITCH_PROBE], capture_output=True,
                          text=True, timeout=300, env=clean_env(**env))
    return proc


def test_switched_off_by_the_environment():
    proc = run_switch_probe(**{_small_gemm.ENV: "off"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["describe"].endswith("small-row kernel off") and out["counts"] == [0, 0]
    assert out["x"] == [[15.0] * 3, [51.0] * 3]
    rows = run_switch_probe(**{_small_gemm.ROWS_ENV: "3"})
    assert rows.returncode == 0, rows.stderr[-2000:]
    assert json.loads(rows.stdout)["rows"] == 3


def test_without_a_compiler_the_blas_serves_and_says_why(tmp_path):
    proc = run_switch_probe(CC=str(tmp_path / "no-such-cc"), XDG_CACHE_HOME=str(tmp_path),
                            TMPDIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert "small-row kernel not built: no C compiler" in out["describe"]
    assert out["counts"] == [0, 0] and out["x"] == [[15.0] * 3, [51.0] * 3]


def test_a_fresh_cache_builds_the_kernel_once(tmp_path):
    if shutil.which("cc") is None:
        pytest.fail("no C compiler on this machine: the kernel cannot be built")
    first = run_switch_probe(XDG_CACHE_HOME=str(tmp_path))
    assert first.returncode == 0, first.stderr[-2000:]
    built = list((tmp_path / "mlx_lm_batched" / "native").glob("small_gemm-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    again = run_switch_probe(XDG_CACHE_HOME=str(tmp_path))
    assert again.returncode == 0 and built[0].stat().st_mtime_ns == stamp
    for proc in (first, again):
        out = json.loads(proc.stdout)
        assert out["counts"][0] >= 1 and out["x"] == [[15.0] * 3, [51.0] * 3]


@pytest.mark.parametrize("name,value", [(_small_gemm.ENV, "fast"),
                                        (_small_gemm.ROWS_ENV, "many"),
                                        (_small_gemm.THREADS_ENV, "-1")])
def test_a_bad_setting_is_named(name, value):
    proc = run_switch_probe(**{name: value})
    assert proc.returncode != 0
    assert f"ValueError: {name}={value!r}" in proc.stderr


def test_ranks_on_one_machine_share_its_cores(tmp_path):
    # mlx.launch's ring hostfile: two ranks on this machine, one elsewhere.
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([["127.0.0.1:5000"], ["127.0.0.1:5001"], ["10.0.0.9:5002"]]))
    code = ("import mlx_lm_batched._small_gemm as g; "
            "print(g.processes_on_this_host(), g.default_threads(), g.threads)")
    for rank, local in (("0", 2), ("2", 1)):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, env=clean_env(MLX_RANK=rank,
                                                         MLX_HOSTFILE=str(hostfile)))
        assert proc.returncode == 0, proc.stderr[-2000:]
        processes, default, threads = map(int, proc.stdout.split())
        cores = len(os.sched_getaffinity(0))
        assert processes == local
        assert default == threads == max(1, min(cores // local, 8))
    alone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300, env=clean_env())
    assert alone.stdout.split()[0] == "1"
