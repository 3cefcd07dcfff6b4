"""mlx-lm's ``models.gated_delta`` module name: the gated delta rule and its layers
(``layers/gated_delta.py``)."""

from ..layers.gated_delta import (
    GatedDeltaNet,
    KimiDeltaAttention,
    gated_delta_rule,
    l2_normalize,
)

__all__ = ["GatedDeltaNet", "KimiDeltaAttention", "gated_delta_rule", "l2_normalize"]
