"""mlx-lm's ``models.mla`` module name: the multi-head latent attention
(``layers/mla.py``)."""

from ..layers.mla import (
    LATENT_NORM_EPS,
    MultiHeadLatentAttention,
    merge_absorbed_kv_b,
    mla_softmax_scale,
)

__all__ = ["MultiHeadLatentAttention", "merge_absorbed_kv_b", "mla_softmax_scale",
           "LATENT_NORM_EPS"]
