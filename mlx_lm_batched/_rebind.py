"""Rebind a loaded library's calls to one function (``native/rebind.c``).

Used by ``mlx_lm_batched._blas`` when ``mlx.core`` was imported first: Python loaded
libmlx with RTLD_NOW, which bound its ``cblas_sgemm`` to the reference BLAS its Linux
wheel links, before our BLAS and small-row kernel could come first in the symbol scope.
:func:`rebind` points libmlx's global offset table entry at the definition now first
in the scope, the binding the dynamic linker would have made had they loaded first.
Built once per machine with the C compiler, like the other native kernels; Linux only.
"""

import ctypes
import os
import subprocess
import sys

from . import _native_build

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "rebind.c")
FLAGS = ["-O2", "-shared", "-fPIC"]

_lib = None


def _load():
    global _lib
    if _lib is None:
        compiler = _native_build.find_compiler("CC", "cc")
        if compiler is None:
            raise OSError("no C compiler (cc) to build the symbol rebinder")
        path = _native_build.cached_build("rebind", "symbol rebinder", compiler, [SOURCE],
                                          FLAGS, _native_build.BuildOptions(timeout=60))
        lib = ctypes.CDLL(path)
        lib.mlxlmb_rebind.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]
        lib.mlxlmb_rebind.restype = ctypes.c_int
        _lib = lib
    return _lib


def global_address(symbol):
    """The address ``symbol`` resolves to in the process's global scope (the first
    definition, as the dynamic linker binds it), or None."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(None), symbol), ctypes.c_void_p).value
    except AttributeError:
        return None


def rebind(library, symbol, address):
    """Point the references to ``symbol`` of every loaded library whose file name starts
    with ``library`` (``"libmlx."``) at ``address``. Returns how many were rewritten (0
    off Linux or when none was found). Raises OSError when the rebinder cannot be built."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        lib = _load()
    except subprocess.SubprocessError as e:
        raise OSError(str(e)) from None
    return lib.mlxlmb_rebind(library.encode(), symbol.encode(), address)
