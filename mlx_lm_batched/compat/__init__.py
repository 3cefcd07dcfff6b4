"""Everything that exists only because mlx-lm has that name or module path.

``module_table.py`` lists mlx-lm's module paths and where their names live here;
``finder.py`` serves those paths on import (``mlx_lm_batched.utils``,
``mlx_lm_batched.models.cache``, ``mlx_lm_batched.models.lfm2-vl`` ...) and refuses
mlx-lm's modules this package does not have in one line; ``reexport.py`` fills a module
from its table row; ``package_module.py`` keeps ``mlx_lm_batched.generate`` the function.
The ``models_*.py`` files hold mlx-lm's functions and classes that this package's own
code does not use (its mask, attention, activation, SSM and gated-delta functional
interfaces, its extra cache names).

Nothing below ``compat`` imports it: it sits at the top of the layers (pyproject.toml).
"""
