"""Our own kernel for MLX's CPU matmuls with few rows (decode steps), ahead of the BLAS.

MLX's CPU ``matmul`` calls ``cblas_sgemm`` once per matrix. In a decode step each
projection multiplies a handful of rows (one per sequence) by a weight matrix; BLAS
libraries pack the weights before multiplying, which for a few rows costs as much as
the product, and OpenBLAS runs a one-row product on one core, so a decode step streamed
the float32 weights at about half the machine's memory bandwidth.
``native/small_gemm.c`` exports a ``cblas_sgemm`` that computes row-major ``A @ B.T``
(MLX's ``x @ W.T``) with at most :data:`max_rows` rows itself, on all cores and with no
packing, and passes every other call to the BLAS. :func:`install` builds it with the
system's C compiler (once per machine, cached like MLX's own compiled CPU kernels) and
loads it into the global symbol scope just before the BLAS, so MLX binds to it.

Every output of the kernel is the same chain of float32 operations whatever the number
of rows, their block or the thread split: a decode row gets the same bits alone as in a
batch of up to :data:`max_rows` rows. Calls with more rows (prefill, bigger decode
batches) keep the BLAS, whose kernels round differently (about 1e-6 relative: the same
order as the BLAS's own blocking differences; see the README's "How batching stays
exact"). Attention's decode products (each KV head's query heads against its keys: a
few rows whatever the batch) are served at every batch size.

Environment:

- ``MLX_LM_BATCHED_SMALL_GEMM``: ``auto`` (default: on where a C compiler builds it),
  ``off`` (or ``0``) to leave every matmul to the BLAS.
- ``MLX_LM_BATCHED_SMALL_GEMM_ROWS``: the most rows it computes itself (default 32: a
  decode step of SmolLM2-135M ran 1.17-1.27x faster at 16 rows than with OpenBLAS's packed
  kernels, 1.06-1.09x at 32, the same at 64 (Intel, AVX-512); on an AVX2-only AMD EPYC
  all of its products ran 1.15-2.6x faster than OpenBLAS at 1-4 rows, 1.06x at 16, 0.75x
  at 32, and decode steps of 16 and 32 rows took about the same time either way;
  measured with scripts/bench_small_gemm.py, docs/performance.md).
- ``MLX_LM_BATCHED_GEMM_THREADS``: its threads (default: the usable cores, at most 8,
  divided among the ranks of a distributed launch on the same machine).
- ``CC``: the compiler (default ``cc``).

Linux only, where a BLAS is loaded by ``mlx_lm_batched._blas``; macOS keeps Accelerate.
"""

import contextlib
import ctypes
import json
import os
import subprocess
import sys

from . import _native_build

ENV = "MLX_LM_BATCHED_SMALL_GEMM"
ROWS_ENV = "MLX_LM_BATCHED_SMALL_GEMM_ROWS"
THREADS_ENV = "MLX_LM_BATCHED_GEMM_THREADS"
DEFAULT_MAX_ROWS = 32
TEAM_SLOTS = 64  # MAX_TEAM in native/small_gemm.c: thread ids it keeps
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "small_gemm.c")
LANES = os.path.join(os.path.dirname(SOURCE), "lanes.h")  # included by both kernels
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-fast-math"]

_lib = None  # the loaded kernel library, once installed
max_rows = 0  # rows up to which our kernel serves (0: not installed or switched off)
threads = 0
problem = None  # why it is not installed, when it was asked for and is not


_ON = ("", "auto", "1", "on")
_OFF = ("0", "off")


def requested():
    """False when ``MLX_LM_BATCHED_SMALL_GEMM`` switches the kernel off.

    Raises ValueError for a value other than auto, 1, on, 0, off.
    """
    value = os.environ.get(ENV, "").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{ENV}={value!r}: expected auto, on, 1, off or 0")
    return value in _ON


def _positive_env(name, default):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a whole number") from None
    if number < 0:
        raise ValueError(f"{name}={value!r}: expected 0 or more")
    return number


def processes_on_this_host():
    """How many processes of a distributed launch share this machine (1 outside one):
    MPI's local size, or the hosts of ``mlx.launch``'s ring hostfile that have this rank's
    address."""
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(name, "").isdigit():
            return max(1, int(os.environ[name]))
    rank, hostfile = os.environ.get("MLX_RANK"), os.environ.get("MLX_HOSTFILE")
    if rank is None or not rank.isdigit():
        return 1
    try:
        with open(hostfile) as f:
            hosts = json.load(f)
        address = hosts[int(rank)][0].rsplit(":", 1)[0]
        return max(1, sum(1 for h in hosts if h and h[0].rsplit(":", 1)[0] == address))
    except (OSError, TypeError, ValueError, IndexError, KeyError, AttributeError):
        return max(1, int(os.environ.get("MLX_WORLD_SIZE", "1") or 1))


def default_threads():
    """The usable cores over the processes of a distributed launch on this machine, at
    most 8 (more only add fork-join cost to small products). Ranks sharing the cores with
    a thread each of their own spinning made a 2-rank pipeline on 2 cores 1.7x slower."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores // processes_on_this_host(), 8))


def build():
    """Path of the compiled kernel library, building it when it is not cached.

    Raises OSError (no compiler, compile error) with the reason.
    """
    compiler = _native_build.find_compiler("CC", "cc")
    if compiler is None:
        raise OSError("no C compiler (cc) to build the small-matmul kernel")
    return _native_build.cached_build(
        "small_gemm", "small-matmul kernel", compiler, [SOURCE], FLAGS,
        _native_build.BuildOptions(headers=(LANES,), timeout=120))


def install(late=False):
    """Build (or find) and load the kernel into the global symbol scope.

    Called by ``mlx_lm_batched._blas`` just before it loads the BLAS, and before
    ``mlx.core`` is imported unless ``late`` (``_blas`` then rebinds MLX's calls to it);
    :func:`attach` then gives it the BLAS. Returns True when loaded. Failures leave every
    matmul to the BLAS and are kept in :data:`problem`.
    """
    global _lib, problem
    if _lib is not None:
        return True
    if (not requested() or not sys.platform.startswith("linux")
            or ("mlx.core" in sys.modules and not late)):
        return False
    try:
        path = build()
        with _native_build.briefly_spinning_openmp_threads():
            _lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except (OSError, subprocess.SubprocessError) as e:
        problem = str(e)
        return False
    _lib.mlxlmb_configure.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    _lib.mlxlmb_configure.restype = ctypes.c_int
    _lib.mlxlmb_set_sharer.argtypes = [ctypes.c_void_p]
    _lib.mlxlmb_set_sharer.restype = None
    return True


def share_threads_with(address):
    """Split the kernel's products over threads with the CPU primitives' helpers
    (``share_chunks`` of ``native/shared_work.cpp`` at ``address``: the caller starts at
    once, helpers join as they wake, nothing waits for a sleeping one) instead of
    OpenMP's parallel for; ``_cpu_prims`` hands it over when it loads."""
    if _lib is not None:
        _lib.mlxlmb_set_sharer(ctypes.c_void_p(address))


def attach(blas):
    """Hand the kernel the BLAS (a ctypes library) for every call it does not serve,
    and switch it on with the configured rows and threads."""
    global max_rows, threads
    if _lib is None:
        return
    rows = _positive_env(ROWS_ENV, DEFAULT_MAX_ROWS)
    threads = _positive_env(THREADS_ENV, 0) or default_threads()
    address = ctypes.cast(blas.cblas_sgemm, ctypes.c_void_p).value
    _lib.mlxlmb_configure(address, rows, threads)
    max_rows = rows


def set_max_rows(rows):
    """Serve matmuls of up to ``rows`` rows with our kernel (0: all to the BLAS).

    Returns the previous value. Benchmarks use it to give another library the plain
    BLAS in the same process; evaluate pending work first (MLX computes lazily).
    """
    global max_rows
    if _lib is None:
        return 0
    previous = _lib.mlxlmb_configure(None, int(rows), threads)
    max_rows = int(rows)
    return previous


def set_threads(count):
    """Split the kernel's products over ``count`` threads (at least 1); returns the
    previous count. Benchmarks compare thread counts with it."""
    global threads
    previous = threads
    threads = max(1, int(count))
    if _lib is not None:
        _lib.mlxlmb_configure(None, max_rows, threads)
    return previous


def counts():
    """``(served, passed)``: matmul calls our kernel computed, and calls it handed to
    the BLAS, since the process started (``(0, 0)`` when not installed)."""
    if _lib is None:
        return 0, 0
    out = (ctypes.c_long * 2)()
    _lib.mlxlmb_counts(out)
    return out[0], out[1]


def team_thread_ids():
    """The OS thread ids that have computed products in the kernel: ``[caller, *workers]``
    (the caller is MLX's CPU stream thread; the workers are the kernel's own OpenMP
    threads); ``[]`` before its first call or when not installed. Profilers use them to
    tell threads' CPU time apart (``scripts/profile_decode.py``)."""
    if _lib is None:
        return []
    out = (ctypes.c_long * TEAM_SLOTS)()
    n = _lib.mlxlmb_team(out, TEAM_SLOTS)
    if not out[0]:
        return []
    return [out[0]] + [t for t in out[1:n] if t and t != out[0]]


@contextlib.contextmanager
def switched_off():
    """Every matmul to the BLAS inside the block (see :func:`set_max_rows`)."""
    previous = set_max_rows(0)
    try:
        yield
    finally:
        set_max_rows(previous)


def describe():
    """A short phrase for ``_blas.describe``: ``"small-row kernel <= 32 rows, 2 threads"``,
    ``"small-row kernel off"`` or ``"small-row kernel not built: <why>"``."""
    if _lib is not None and max_rows:
        return f"small-row kernel <= {max_rows} rows, {threads} thread{'s' * (threads != 1)}"
    if problem:
        return f"small-row kernel not built: {problem}"
    return "small-row kernel off"
