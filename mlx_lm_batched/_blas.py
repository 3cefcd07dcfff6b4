"""Load a fast CPU BLAS before ``mlx.core`` so MLX's CPU matmuls use it.

MLX's Linux CPU wheel calls the generic ``cblas_sgemm`` and bundles a slow
reference BLAS (a few GFLOP/s). When a fast BLAS is already loaded with
RTLD_GLOBAL, the dynamic linker resolves MLX's BLAS symbols to it instead, and
float32 matmuls get 10-40x faster. This only matters on Linux (macOS uses
Accelerate, CUDA builds use cuBLAS for GPU matmuls) and must run before the
first ``import mlx.core``; ``import mlx_lm_batched`` does it.

``MLX_LM_BATCHED_BLAS`` chooses the library:

- ``auto`` (default): Intel MKL (the ``mkl`` wheel, a dependency on Linux
  x86-64) on Intel CPUs; on other CPUs a system OpenBLAS when one is installed
  (MKL's kernels are tuned for Intel), else MKL; else the bundled BLAS.
- ``mkl``, ``openblas``: that library; a warning names the variable when it is
  not found, and the bundled BLAS stays.
- ``none``: MLX's bundled BLAS.

MKL runs sequentially (on the calling thread) unless ``MKL_THREADING_LAYER``,
``MKL_NUM_THREADS`` or ``OMP_NUM_THREADS`` is set: its threads stall when the
cores are busy (see ``_configure_mkl_threads``). OpenBLAS keeps its defaults.

Importing ``mlx.core`` first is fine: libmlx's ``cblas_sgemm`` binding is then rewritten
to point here (``_rebind``), as if this module had loaded first.

``MLX_LM_BATCHED_NO_OPENBLAS=1`` is an alias of ``none``, and
``MLX_LM_BATCHED_OPENBLAS=/path/libopenblas.so.0`` names the OpenBLAS to load
(and chooses it in ``auto``). :func:`describe` says which BLAS serves MLX.
"""

import ctypes
import glob
import os
import sys

from . import _rebind, _small_gemm

ENV = "MLX_LM_BATCHED_BLAS"
CHOICES = ("auto", "mkl", "openblas", "none")
DISABLE_ENV = "MLX_LM_BATCHED_NO_OPENBLAS"  # older switch: an alias of MLX_LM_BATCHED_BLAS=none
OPENBLAS_ENV = "MLX_LM_BATCHED_OPENBLAS"

# Debian/Ubuntu (libopenblas0-pthread / -openmp / -serial), Fedora, generic.
_OPENBLAS_CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
    "/usr/local/lib/libopenblas.so.0",
]
# Outside a Python environment: Debian's libmkl-rt, oneAPI's default prefix.
_MKL_DIRS = ["/usr/lib/x86_64-linux-gnu", "/opt/intel/oneapi/mkl/latest/lib"]

loaded_kind = None  # "mkl" or "openblas" once loaded here, else None
loaded_path = None  # the library that was loaded, or None


def requested():
    """The choice the environment asks for: one of :data:`CHOICES`.

    Raises ValueError for an unknown value of ``MLX_LM_BATCHED_BLAS``.
    """
    value = os.environ.get(ENV, "").strip().lower()
    if value and value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(CHOICES)}")
    if os.environ.get(DISABLE_ENV, "") not in ("", "0") and value in ("", "auto"):
        return "none"
    return value or "auto"


def find_openblas():
    """Path of a system OpenBLAS (or ``MLX_LM_BATCHED_OPENBLAS``'s), or None."""
    explicit = os.environ.get(OPENBLAS_ENV)
    if explicit:
        return explicit if os.path.exists(explicit) else None
    for path in _OPENBLAS_CANDIDATES:
        if os.path.exists(path):
            return path
    hits = sorted(glob.glob("/usr/lib/*/openblas*/libopenblas*.so*"))
    return hits[0] if hits else None


def _mkl_from_metadata():
    # The wheel installs its libraries as data files (into the environment's lib/);
    # its RECORD lists them, wherever the environment is.
    from importlib import metadata

    try:
        dist = metadata.distribution("mkl")
    except metadata.PackageNotFoundError:
        return []
    return [str(dist.locate_file(f)) for f in dist.files or [] if f.name.startswith("libmkl_rt.so")]


def find_mkl():
    """Path of Intel MKL's single dynamic library ``libmkl_rt.so*``, or None.

    Looks in this environment's ``lib/`` (where ``pip install mkl`` puts it), the
    files of the installed ``mkl`` distribution, ``LD_LIBRARY_PATH`` and a few
    system directories.
    """
    def first_file(paths):
        return next((p for p in paths if os.path.isfile(p)), None)

    # Reading the distribution's RECORD costs importlib.metadata's import (tens of ms at
    # every ``import mlx_lm_batched``): only when the environment's lib/ has no MKL.
    found = first_file(sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")),
                              reverse=True)) or first_file(_mkl_from_metadata())
    if found:
        return found
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) + _MKL_DIRS:
        if d:
            found = first_file(sorted(glob.glob(os.path.join(d, "libmkl_rt.so*")),
                                      reverse=True))
            if found:
                return found
    return None


def cpu_vendor():
    """``"intel"``, ``"amd"``, another vendor id in lower case, or ``""`` when unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    vendor = line.split(":", 1)[1].strip()
                    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vendor,
                                                                                vendor.lower())
    except OSError:
        pass
    return ""


def _auto_order():
    if os.environ.get(OPENBLAS_ENV):
        return ["openblas", "mkl"]
    if cpu_vendor() == "intel":
        return ["mkl", "openblas"]
    # MKL's fast paths are tuned for Intel CPUs; a system OpenBLAS is the safer choice on
    # AMD and others, MKL the fallback (still far faster than the reference BLAS).
    return ["openblas", "mkl"]


def _configure_mkl_threads(lib):
    # MKL's OpenMP threads wait at a barrier after every GEMM. Where the cores are busy
    # (other processes, MLX's own thread, the Python thread building the next step) a
    # descheduled worker stalls each of the ~200 GEMMs of a decode step: measured on a
    # shared 2-core machine, threaded MKL decoded 3-30x slower than sequential MKL. So
    # MKL runs on the calling thread unless the user chose its threading.
    if any(os.environ.get(v) for v in ("MKL_THREADING_LAYER", "MKL_NUM_THREADS",
                                       "OMP_NUM_THREADS")):
        return
    try:
        lib.MKL_Set_Threading_Layer(1)  # MKL_THREADING_SEQUENTIAL, before any other call
    except AttributeError:
        pass


def _load(kind, late=False):
    path = find_mkl() if kind == "mkl" else find_openblas()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)  # loadable? (local scope: no symbol is bound to it yet)
    except OSError:
        return None
    # Our small-row matmul kernel takes the global scope's cblas_sgemm first, then hands
    # the calls it does not serve to this library (see _small_gemm).
    _small_gemm.install(late=late)
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    if kind == "mkl":
        _configure_mkl_threads(lib)
    _small_gemm.attach(lib)
    return path


def _warn(message):
    # One line on stderr: this runs at import, where a warnings.warn would also print
    # the source line of the import.
    sys.stderr.write(f"mlx_lm_batched: warning: {message}\n")


def preload(choice=None):
    """Load the BLAS ``choice`` (default: :func:`requested`) globally.

    Returns the loaded library's path, or None when MLX keeps its bundled BLAS.
    Does nothing off Linux. Once ``mlx.core`` is imported, MLX's binding to its bundled
    BLAS is rewritten to the library loaded here (:func:`_rebind_late`).
    """
    global loaded_kind, loaded_path
    if loaded_path is not None:
        return loaded_path
    choice = choice or requested()
    if not sys.platform.startswith("linux") or choice == "none":
        return None
    # This is the one native step that must stay at import: the BLAS (and the small-row
    # kernel ahead of it) must be in the global symbol scope before ``mlx.core`` loads,
    # or MLX binds its matmuls to the bundled BLAS (see _rebind_late when it came first).
    late = "mlx.core" in sys.modules
    for kind in ([choice] if choice != "auto" else _auto_order()):
        path = _load(kind, late)
        if path is not None:
            loaded_kind, loaded_path = kind, path
            if late:
                _rebind_late(kind)
            return path
    if choice != "auto":
        hint = "pip install mkl" if choice == "mkl" else "apt-get install libopenblas0-pthread"
        _warn(f"{ENV}={choice}: no {choice} library found ({hint}); using MLX's bundled BLAS")
    return None


def _rebind_late(kind):
    """``mlx.core`` came first (``import mlx.core as mx`` ahead of ``mlx_lm_batched``:
    most mlx-lm code): Python's RTLD_NOW load bound libmlx's ``cblas_sgemm`` to the
    reference BLAS its wheel links (a 121-token prefill of SmolLM2's Q4_1 GGUF took 8 s
    instead of 0.5). Point that binding at the definition first in the global scope now
    (our small-row kernel, else the BLAS just loaded), as if they had loaded first."""
    address = _rebind.global_address("cblas_sgemm")
    try:
        done = address is not None and _rebind.rebind("libmlx.", "cblas_sgemm", address) > 0
    except OSError as e:
        done, why = False, str(e)
    else:
        why = "no cblas_sgemm reference found in libmlx"
    if not done:
        _warn(f"mlx.core was imported before mlx_lm_batched and MLX's matmuls could not be "
              f"pointed at {kind} ({why}): they keep MLX's bundled BLAS; import "
              "mlx_lm_batched first")


def _version(kind, path):
    """The loaded library's own version and thread count, '' when it cannot say."""
    try:
        lib = ctypes.CDLL(path)
        if kind == "mkl":
            buf = ctypes.create_string_buffer(256)
            lib.MKL_Get_Version_String(buf, len(buf))
            # "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build ..."
            text = buf.value.decode(errors="replace")
            version = text.split("Version", 1)[1].split("-")[0].strip() if "Version" in text else ""
            threads = lib.MKL_Get_Max_Threads()
        else:
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_get_corename.restype = ctypes.c_char_p
            config = lib.openblas_get_config().decode(errors="replace").split()
            version = config[1] if len(config) > 1 and config[0] == "OpenBLAS" else ""
            version += " " + lib.openblas_get_corename().decode(errors="replace")
            threads = lib.openblas_get_num_threads()
        return f"{version.strip()}, {threads} thread{'s' if threads != 1 else ''}"
    except (OSError, AttributeError, IndexError):
        return ""


def describe():
    """One short line naming the BLAS that serves MLX's CPU matmuls, e.g.
    ``"mkl 2026.2, 1 thread (libmkl_rt.so.3)"``, ``"openblas 0.3.21 SkylakeX,
    2 threads (/usr/lib/.../libopenblas.so.0)"`` or ``"bundled (reference)"``."""
    if sys.platform == "darwin":
        return "accelerate (macOS)"
    if loaded_path is None:
        return "bundled (reference)"
    version = _version(loaded_kind, loaded_path)
    where = os.path.basename(loaded_path) if loaded_kind == "mkl" else loaded_path
    return f"{loaded_kind} {version} ({where}); {_small_gemm.describe()}".replace("  ", " ")


preload()
