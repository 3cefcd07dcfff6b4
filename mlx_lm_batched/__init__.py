"""mlx_lm_batched: mlx-lm with batched generation as a first-class citizen.

Import it instead of ``mlx_lm``: ``from mlx_lm_batched import load, generate,
stream_generate, batch_generate``.

The public names are imported on first use (PEP 562), so ``import mlx_lm_batched``
and ``python -m mlx_lm_batched.generate`` start without loading MLX: the command
line can install its Ctrl-C handler before the heavy imports.
"""

import importlib
import sys
import warnings

from . import _blas  # noqa: F401  (must run before the first `import mlx.core`)
from . import _malloc  # noqa: F401  (glibc keeps freed arrays' pages: see _malloc)
from . import _submodules
from .compat import finder as _compat_finder
from .compat.package_module import PackageModule as _PackageModule

# mlx-lm's module paths without a file of their own (``utils``, ``models.cache``, the
# model aliases ...) are served from compat/module_table.py by an import hook.
_compat_finder.install()

# `python -m mlx_lm_batched.generate` runs a module this package also imports
# (as mlx-lm's does); runpy's warning about that is noise for users.
warnings.filterwarnings(
    "ignore", category=RuntimeWarning, message=r".*'mlx_lm_batched\.\w+' found in sys\.modules"
)

from ._version import __version__  # noqa: F401  (also read by pyproject.toml)

_LAZY = {
    "load": ".loading.load",
    "generate": ".api.generate",
    "stream_generate": ".api.generate",
    "batch_generate": ".api.batch",
    "stream_batch_generate": ".api.batch",
    "generate_step": ".api.generate",
    "GenerationResponse": ".api.responses",
    "BatchResponse": ".api.responses",
    "convert": ".loading.convert",
}
__all__ = list(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        # A submodule (``mlx_lm_batched.utils`` ...), as after ``import mlx_lm``.
        return _submodules.submodule(__name__, name)
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


sys.modules[__name__].__class__ = _PackageModule  # keeps .generate the function
