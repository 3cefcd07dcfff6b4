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
from concurrent.futures import ThreadPoolExecutor
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
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
# Rounds a thread spins for the next parallel region before it sleeps: about 10 us by
# libgomp's estimate (100,000 rounds a millisecond).
BRIEF_SPIN_COUNT = "1000"


@contextlib.contextmanager
def briefly_spinning_openmp_threads():
    """Load a kernel library inside this block so that the OpenMP runtime it brings
    (libgomp, read once when it loads) lets a thread with nothing to do spin briefly for
    the next parallel region, then sleep (``OMP_WAIT_POLICY=active GOMP_SPINCOUNT=1000``).

    Our kernels open a parallel region per matmul (hundreds per decode step), a few
    microseconds apart. libgomp's default spins up to 300,000 rounds: when the cores are
    shared (two processes, a busy machine) the partner is often descheduled and the
    spinning takes the core it needs (two processes on 2 cores, each decoding one row of a
    4-bit SmolLM2: 131.3 s spinning, 6.0 s sleeping). Sleeping at once (``passive``) makes
    every region wake its partner, which costs most where a sleeping core must be woken
    (a virtual machine): the same process alone took 6.2 s sleeping, 3.5 s with the brief
    spin (and 7.9 s two at once); float32 at 8 rows, 9.7 and 9.5 s alone, 18.0 and 15.4 s
    two at once (``scripts/bench_openmp_wait.py``, docs/performance.md). A value the user
    set for either variable is kept; the variables are restored afterwards, so other
    OpenMP runtimes loaded later (torch's) and child processes see the environment they
    had.
    """
    if os.environ.get(WAIT_POLICY_ENV) or os.environ.get(SPIN_COUNT_ENV):
        yield
        return
    os.environ[WAIT_POLICY_ENV] = "active"
    os.environ[SPIN_COUNT_ENV] = BRIEF_SPIN_COUNT
    try:
        yield
    finally:
        os.environ.pop(WAIT_POLICY_ENV, None)
        os.environ.pop(SPIN_COUNT_ENV, None)


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


def _compile_and_link(compiler, sources, flags, out, timeout):
    """``compiler sources flags -o out`` as one object file per source, compiled up to the
    cores at once, then one link: the CPU primitives' dozen files took 57 s in one call
    on 2 cores. Returns the first failed step's CompletedProcess, else the link's."""
    if len(sources) == 1:
        return subprocess.run([compiler, *sources, *flags, "-o", out],
                              capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(out)) as objects:
        outputs = [os.path.join(objects, f"{i}.o") for i in range(len(sources))]

        def compile_one(i):
            # Link-only options (-L, -l, -Wl) are unused here, as the link uses them.
            return subprocess.run([compiler, "-c", sources[i], *flags, "-o", outputs[i]],
                                  capture_output=True, text=True, timeout=timeout)

        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            for done in pool.map(compile_one, range(len(sources))):
                if done.returncode != 0:
                    return done
        return subprocess.run([compiler, *outputs, *flags, "-o", out],
                              capture_output=True, text=True, timeout=timeout)


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
                done = _compile_and_link(compiler, sources, flags, partial, timeout)
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
