"""mlx-lm's ``models.base``: the config base class and the mask and attention functions
that architecture code written for mlx-lm imports from here."""

from ..layers.collectives import gather_last_axis
from ..layers.mlx_lm_api import (
    create_attention_mask,
    create_causal_mask,
    quantized_scaled_dot_product_attention,
    scaled_dot_product_attention,
)
from ..layers.ssm_api import create_ssm_mask
from .args import BaseModelArgs

__all__ = ["BaseModelArgs", "create_attention_mask", "create_causal_mask", "create_ssm_mask",
           "gather_last_axis", "quantized_scaled_dot_product_attention",
           "scaled_dot_product_attention"]
