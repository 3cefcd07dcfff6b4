"""mlx-lm's ``models.ssm`` module name: the state-space and convolution pieces
(``layers/ssm.py``)."""

from ..layers.ssm import (
    CausalConv1d,
    GatedRMSNorm,
    HybridBlock,
    NormedResidualBlock,
    ShortConv,
    base_cache,
    causal_conv,
    column_validity,
    rg_lru_scan,
    selective_scan,
    ssd_scan,
    weightless_rms_norm,
)

__all__ = ["CausalConv1d", "GatedRMSNorm", "HybridBlock", "NormedResidualBlock", "ShortConv",
           "base_cache", "causal_conv", "column_validity", "rg_lru_scan", "selective_scan",
           "ssd_scan", "weightless_rms_norm"]
