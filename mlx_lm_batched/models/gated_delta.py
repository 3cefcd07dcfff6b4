"""mlx-lm's ``models.gated_delta`` module name: the gated delta rule and its layers
(``layers/gated_delta.py``) and mlx-lm's functions of the same module
(``layers/gated_delta_api.py``)."""

from ..layers.gated_delta import (
    GatedDeltaNet,
    KimiDeltaAttention,
    gated_delta_rule,
    l2_normalize,
)
from ..layers.gated_delta_api import (
    compute_g,
    compute_lower_bound_g,
    gated_delta_kernel,
    gated_delta_kernel_unpacked,
    gated_delta_kernel_xtree,
    gated_delta_ops,
    gated_delta_update,
    normalize_qk,
)

__all__ = ["GatedDeltaNet", "KimiDeltaAttention", "compute_g", "compute_lower_bound_g",
           "gated_delta_kernel", "gated_delta_kernel_unpacked", "gated_delta_kernel_xtree",
           "gated_delta_ops", "gated_delta_rule", "gated_delta_update", "l2_normalize",
           "normalize_qk"]
