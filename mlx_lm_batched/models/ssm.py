"""mlx-lm's ``models.ssm`` module name: the state-space and convolution pieces
(``layers/ssm.py``) and mlx-lm's functions of the same module (``layers/ssm_api.py``)."""

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
from ..layers.ssm_api import (
    compute_dt,
    make_ssm_kernel,
    segsum,
    ssm_attn,
    ssm_update,
    ssm_update_kernel,
)

__all__ = ["CausalConv1d", "GatedRMSNorm", "HybridBlock", "NormedResidualBlock", "ShortConv",
           "base_cache", "causal_conv", "column_validity", "compute_dt", "make_ssm_kernel",
           "rg_lru_scan", "segsum", "selective_scan", "ssd_scan", "ssm_attn", "ssm_update",
           "ssm_update_kernel", "weightless_rms_norm"]
