"""Load a system OpenBLAS before ``mlx.core`` so MLX's CPU matmuls use it.

MLX's Linux CPU wheel links against the generic ``cblas_sgemm`` symbol and bundles
a slow reference BLAS. When a fast OpenBLAS is already loaded with RTLD_GLOBAL,
the dynamic linker resolves MLX's BLAS symbols to it instead: float matmuls get
about 10x faster on x86-64. This only matters on Linux (macOS uses Accelerate,
CUDA builds use cuBLAS) and must run before the first ``import mlx.core``.

Set ``MLX_LM_BATCHED_NO_OPENBLAS=1`` to keep MLX's bundled BLAS.
"""

import ctypes
import glob
import os
import sys

DISABLE_ENV = "MLX_LM_BATCHED_NO_OPENBLAS"

# Debian/Ubuntu (libopenblas0-pthread / -openmp / -serial), Fedora, generic.
_CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
    "/usr/local/lib/libopenblas.so.0",
]

loaded_path = None  # the library that was loaded, or None


def _find_openblas():
    explicit = os.environ.get("MLX_LM_BATCHED_OPENBLAS")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    for path in _CANDIDATES:
        if os.path.exists(path):
            return path
    hits = sorted(glob.glob("/usr/lib/*/openblas*/libopenblas*.so*"))
    return hits[0] if hits else None


def preload_openblas():
    """Load a system OpenBLAS globally; return its path, or None when not used."""
    global loaded_path
    if loaded_path is not None:
        return loaded_path
    if not sys.platform.startswith("linux") or os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None
    if "mlx.core" in sys.modules:
        # Too late: MLX already resolved its BLAS symbols.
        return None
    path = _find_openblas()
    if path is None:
        return None
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    loaded_path = path
    return path


preload_openblas()
