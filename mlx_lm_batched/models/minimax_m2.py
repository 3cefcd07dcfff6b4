"""MiniMax-M2: Mixtral blocks without a window, RMS QK-norm over the whole q/k
projections, partial RoPE (``rotary_dim`` or ``partial_rotary_factor``), and a
sigmoid router whose choice (not weights) is shifted by ``e_score_correction_bias``,
weights renormalised over the chosen experts."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.attention_options import QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.moe import SparseMoE, softmax_topk
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, config_rope, init_causal_lm
from .mixtral import stack_mixtral_experts


@dataclass
class ModelArgs(DecoderArgs):
    num_local_experts: int = 256
    num_experts_per_tok: int = 8
    rms_norm_eps: float = 1e-6
    rotary_dim: Optional[int] = None
    partial_rotary_factor: Optional[float] = None
    # mlx-lm's fields for variants this file does not have: shared experts (mlx-lm
    # reads the size nowhere), a softmax router, attention without QK-norm.
    shared_intermediate_size: int = 0
    scoring_func: str = "sigmoid"
    use_qk_norm: bool = True

    def __post_init__(self):
        super().__post_init__()
        require_values(self, shared_intermediate_size=(0,), scoring_func=("sigmoid",),
                       use_qk_norm=(True,))

    def rotary_dims(self):
        if self.rotary_dim:
            return self.rotary_dim
        return int(self.head_dim * (self.partial_rotary_factor or 1.0))


class SigmoidMoE(SparseMoE):
    """Routed experts with MiniMax-M2's biased sigmoid choice."""

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k):
        super().__init__(hidden_size, intermediate_size, num_experts, top_k, normalize=True)
        self.e_score_correction_bias = mx.zeros((num_experts,))

    def route(self, x):
        return softmax_topk(self.gate(x), self.top_k, normalize=True, sigmoid=True,
                            choice_bias=self.e_score_correction_bias)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.rotary_dims())
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, qk_norm=QKNorm(norm, full=True)),
                SigmoidMoE(args.hidden_size, args.intermediate_size, args.num_local_experts,
                           args.num_experts_per_tok),
                norm,
                mlp_name="block_sparse_moe",
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        return stack_mixtral_experts(super().sanitize(weights), self.args)
