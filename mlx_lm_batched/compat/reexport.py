"""Filling a module of mlx-lm's path with the names ``module_table`` lists for it."""

import importlib

from . import module_table

PACKAGE = __name__.split(".")[0]  # "mlx_lm_batched"


def relative_path(module_name):
    """``"models.cache"`` for ``"mlx_lm_batched.models.cache"``, or None outside the
    package."""
    prefix = PACKAGE + "."
    return module_name[len(prefix):] if module_name.startswith(prefix) else None


def export_names(namespace):
    """Bind, in ``namespace`` (a module's globals), the names ``module_table`` lists for
    that module's path (its ``__name__``), importing the modules that define them.
    Returns the bound names, sorted, for the module's ``__all__``."""
    name = namespace["__name__"]
    table = module_table.sources(relative_path(name) or "")
    if table is None:
        raise ImportError(f"{name} has no row in mlx_lm_batched/compat/module_table.py")
    exported = []
    for module, names in table.items():
        source = importlib.import_module(f"{PACKAGE}.{module}")
        for entry in names:
            alias, _, original = entry.partition("=")
            namespace[alias] = getattr(source, original or alias)
            exported.append(alias)
    return sorted(exported)
