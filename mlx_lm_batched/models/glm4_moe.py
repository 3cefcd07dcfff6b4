"""GLM-4.5 / 4.6 (``glm4_moe``): GQA attention (biased q/k/v, optional QK-norm, RoPE on
the first ``partial_rotary_factor`` of each head), dense MLPs for the first
``first_k_dense_replace`` layers, then DeepSeek-V3 MoE blocks: a sigmoid router whose
choice is biased by ``e_score_correction_bias`` and limited to the best expert
groups, plus shared experts. The checkpoint's multi-token-prediction layers (after
the last decoder layer) are dropped."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.moe import stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, config_rope, init_causal_lm, type_windows
from .deepseek_v2 import DeepseekMoE
from .deepseek_v3 import SigmoidGate


@dataclass
class ModelArgs(DecoderArgs):
    moe_intermediate_size: int = 1408
    n_routed_experts: int = 128
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    first_k_dense_replace: int = 1
    rms_norm_eps: float = 1e-5
    partial_rotary_factor: float = 0.5
    attention_bias: bool = False
    scoring_func: str = "sigmoid"  # mlx-lm's fields: the only router GLM-4 MoE has
    topk_method: str = "noaux_tc"

    SCORING_FUNCS = ("sigmoid",)  # the router's names this family's configs use

    def __post_init__(self):
        super().__post_init__()
        require_values(self, scoring_func=self.SCORING_FUNCS, topk_method=("noaux_tc",))
    use_qk_norm: bool = False
    mlp_bias: bool = False
    sliding_window: Optional[int] = None  # dots1
    layer_types: Optional[List[str]] = None  # dots1

    def is_moe_layer(self, i):
        return bool(self.n_routed_experts) and i >= self.first_k_dense_replace

    def layer_windows(self):
        types = self.layer_types or ["full_attention"] * self.num_hidden_layers
        return type_windows(types, self.sliding_window)


class Model(CausalLM):
    def __init__(self, args: ModelArgs, qk_norm=None, o_bias=False):
        """``qk_norm``/``o_bias``: what dots1 changes (QK-norm always, unbiased o_proj)."""
        super().__init__()
        rope = config_rope(args, int(args.head_dim * args.partial_rotary_factor))
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        if qk_norm is None:
            qk_norm = args.use_qk_norm
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, qk_norm=QKNorm(norm) if qk_norm else None,
                          projections=Projections(bias=args.attention_bias, o_bias=o_bias)),
                DeepseekMoE(args, SigmoidGate(args)) if args.is_moe_layer(i) else
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for i in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), args.layer_windows())

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        n = self.args.num_hidden_layers
        weights = {k: v for k, v in weights.items()
                   if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= n)}
        for i in range(n):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.n_routed_experts)
        return weights
