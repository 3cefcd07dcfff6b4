"""Compiling the package's native kernels with the system's compiler, once per machine.

``native/small_gemm.c`` (``_small_gemm``) and ``native/*.cpp``
(``_cpu_prims``) are built with ``-march=native`` on first use, like MLX's own
compiled CPU kernels, and cached under ``~/.cache/mlx_lm_batched/native`` (or the temp
directory) by a key over everything the binary depends on: the sources, the compiler,
the flags, the CPU's instruction sets and whatever else the caller names (library
versions).
"""

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

try:
    import fcntl
except ImportError:  # not on POSIX: builders may race, each writing its own file
    fcntl = None


def cpu_signature():
    """The CPU's model and instruction-set flags: a ``-march=native`` build runs only on
    CPUs with the same instruction sets (a home directory may be shared)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags",
                                                            "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def cache_dirs():
    """Where built kernels are kept, in order of preference."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "mlx_lm_batched", "native"),
            os.path.join(tempfile.gettempdir(), "mlx_lm_batched")]


WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


@contextlib.contextmanager
def sleeping_openmp_threads():
    """Load a kernel library inside this block so that the OpenMP runtime it brings
    (libgomp, read once when it loads) lets idle threads sleep instead of spinning.

    Our kernels open a parallel region per matmul (hundreds per decode step). With
    libgomp's default, a thread that finished its share spins for its partner; when the
    cores are shared (two processes, a busy machine) the partner is often descheduled
    and the spinning takes the core it needs: two processes each decoding 8 rows on a
    2-core machine took 109.6 s spinning and 43.0 s sleeping, one process alone 21.0 and
    21.8 s (``scripts/bench_openmp_wait.py``, docs/performance.md). A value the
    user set is kept; the variable is restored afterwards, so other OpenMP runtimes
    loaded later (torch's) and child processes see the environment they had.
    """
    if os.environ.get(WAIT_POLICY_ENV):
        yield
        return
    os.environ[WAIT_POLICY_ENV] = "passive"
    try:
        yield
    finally:
        os.environ.pop(WAIT_POLICY_ENV, None)


def find_compiler(env, default):
    """Full path of the compiler named by ``$env`` (else ``default``), or None."""
    return shutil.which(os.environ.get(env, default))


def _identity(path):
    # The compiler by its file (a new compiler is a new file), not by running it: this
    # runs at every import.
    real = os.path.realpath(path)
    stat = os.stat(real)
    return f"{real} {stat.st_size} {stat.st_mtime_ns}"


@contextlib.contextmanager
def _exclusive(directory, name):
    """One builder of ``name`` at a time in ``directory`` (others wait, then find it)."""
    if fcntl is None:
        yield
        return
    with open(os.path.join(directory, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _failure(path):
    """The error line a failed build of ``path`` left (``<path>.failed``), or None."""
    try:
        with open(path + ".failed") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _remember_failure(path, message):
    # A compile error is kept under the same key as the binary would have been: the
    # small-matmul kernel is built at import, and a build that cannot succeed (the same
    # sources, compiler, flags and CPU) would otherwise cost its compile time on every
    # import. A changed source or compiler is a new key, and builds again.
    with contextlib.suppress(OSError):
        with open(path + ".failed", "w") as f:
            f.write(message + "\n")


@dataclass(frozen=True)
class BuildOptions:
    """What a build needs beyond its compile command: the binary's file ``suffix``,
    the ``headers`` its sources include and the ``key_parts`` (other strings it
    depends on, such as library versions) that both enter the cache key, and the
    compiler's ``timeout`` in seconds."""

    suffix: str = ".so"
    headers: tuple = ()
    key_parts: tuple = ()
    timeout: float = 300


def cached_build(name, what, compiler, sources, flags, options=BuildOptions()):
    """Path of ``name-<key><suffix>`` built by ``compiler sources flags -o out`` (link
    options go last in ``flags``), building it when no cache directory holds it.

    ``compiler``: a full path (callers say which compiler is missing, by language);
    ``what`` names the kernel in errors; ``options``: a :class:`BuildOptions`. Raises
    OSError (compile error, also the one a previous build under the same key met; no
    writable directory).
    """
    suffix, headers, timeout = options.suffix, options.headers, options.timeout
    parts = [_identity(compiler), " ".join(flags), cpu_signature(), *options.key_parts]
    contents = []
    for source in [*sources, *headers]:
        with open(source, "rb") as f:
            contents.append(f.read())
    key = hashlib.sha256(b"\0".join(contents + [p.encode() for p in parts])).hexdigest()[:16]
    for directory in cache_dirs():
        path = os.path.join(directory, f"{name}-{key}{suffix}")
        if os.path.exists(path):
            return path
        failed = _failure(path)
        if failed:  # the same sources, compiler and flags failed before: say so again
            raise OSError(failed)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, partial = tempfile.mkstemp(suffix=suffix, dir=directory)
            os.close(fd)
        except OSError:
            continue
        try:
            with _exclusive(directory, name):
                if os.path.exists(path):  # another process built it meanwhile
                    return path
                done = subprocess.run([compiler, *sources, *flags, "-o", partial],
                                      capture_output=True, text=True, timeout=timeout)
                if done.returncode != 0:
                    lines = [line for line in done.stderr.strip().splitlines()
                             if "error" in line] or done.stderr.strip().splitlines() or ["?"]
                    _remember_failure(path, f"building the {what} failed: {lines[0]}")
                    raise OSError(f"building the {what} failed: {lines[0]}")
                os.replace(partial, path)  # atomic: readers see a whole file or none
                return path
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    raise OSError(f"no writable cache directory for the {what}")
