"""Submodules as attributes of their package, imported on first use.

mlx-lm's ``__init__`` files import their modules eagerly, so code written for it
reaches ``mlx_lm.utils`` or ``mlx_lm.models.cache`` as attributes after a bare
``import mlx_lm``. This package imports lazily (``import mlx_lm_batched`` loads no MLX);
the package and ``models`` each end their module ``__getattr__`` (PEP 562) with this.
"""

import importlib
import importlib.util


def submodule(package, name):
    """The submodule ``name`` of the package called ``package`` (its ``__name__``),
    imported now; ``AttributeError``, worded as Python's, when there is none or the name
    is private."""
    if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
        return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
