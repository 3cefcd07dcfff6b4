"""Qwen 3: Qwen 2 with per-head RMS QK-norm before RoPE and one bias flag for all
four attention projections."""

from ..layers.attention_options import Projections, QKNorm
from ..layers.norms import RMSNorm
from .qwen2 import Model as Qwen2Model
from .qwen2 import ModelArgs  # noqa: F401  (same config fields)


class Model(Qwen2Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, attention_kwargs=dict(
            projections=Projections(bias=args.attention_bias),
            qk_norm=QKNorm(lambda dims: RMSNorm(dims, args.rms_norm_eps)),
        ))
