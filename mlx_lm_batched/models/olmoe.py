"""OLMoE: Qwen 3 MoE blocks (softmax top-k router, no shared expert) whose RMS QK-norm
covers the whole q/k projections, experts of ``intermediate_size``, and optional
``clip_qkv`` clamping."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention_options import Projections, QKNorm
from ..layers.norms import RMSNorm
from . import qwen2_moe
from .args import require_values


@dataclass
class ModelArgs(qwen2_moe.ModelArgs):
    num_experts: Optional[int] = 64
    num_experts_per_tok: int = 8
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    clip_qkv: Optional[float] = None

    mlp_bias: bool = False  # mlx-lm's field; OLMoE experts have no bias

    def __post_init__(self):
        super().__post_init__()
        require_values(self, mlp_bias=(False,))
        self.moe_intermediate_size = self.intermediate_size  # every expert's width


class Model(qwen2_moe.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, shared_expert=False, attention_kwargs=dict(
            projections=Projections(bias=args.attention_bias, clip=args.clip_qkv),
            qk_norm=QKNorm(lambda dims: RMSNorm(dims, args.rms_norm_eps), full=True),
        ))
