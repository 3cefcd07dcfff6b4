"""mlx-lm's ``models.mla`` module name: the multi-head latent attention
(``layers/mla.py``) and mlx-lm's per-head linear maps (``layers/multi_linear.py``)."""

from ..layers.mla import (
    LATENT_NORM_EPS,
    MultiHeadLatentAttention,
    merge_absorbed_kv_b,
    mla_softmax_scale,
)
from ..layers.multi_linear import MultiLinear, QuantizedMultiLinear

__all__ = ["MultiHeadLatentAttention", "MultiLinear", "QuantizedMultiLinear",
           "merge_absorbed_kv_b", "mla_softmax_scale", "LATENT_NORM_EPS"]
