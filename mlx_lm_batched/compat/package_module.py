"""The package module's class: ``mlx_lm_batched.generate`` and ``.convert`` stay the
functions, as mlx-lm's eager ``from .generate import generate`` in its ``__init__`` keeps
them."""

import types

# Submodules named like the function they hold (mlx-lm's ``generate`` and ``convert``).
SHADOWED = ("generate", "convert")


class PackageModule(types.ModuleType):
    """Importing the submodule ``generate`` binds it on the package (the import system
    does); this binds the function of that name instead."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in SHADOWED:
            value = getattr(value, name)
        super().__setattr__(name, value)
