"""DeepSeek (V1 / DeepSeek-MoE): llama attention; from layer ``first_k_dense_replace``
on (every ``moe_layer_freq``-th layer) a softmax top-k router over SwiGLU experts,
weights not renormalised, plus always-on ``shared_experts``."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.moe import SharedExpert, SparseMoE, stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    moe_intermediate_size: int = 1407
    n_shared_experts: Optional[int] = None
    n_routed_experts: Optional[int] = None
    num_experts_per_tok: Optional[int] = None
    moe_layer_freq: int = 1
    first_k_dense_replace: int = 0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False

    def is_moe_layer(self, i):
        return (bool(self.n_routed_experts) and i >= self.first_k_dense_replace
                and i % self.moe_layer_freq == 0)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)

        def mlp(i):
            if not args.is_moe_layer(i):
                return MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
            shared = None
            if args.n_shared_experts:
                shared = SharedExpert(MLP(args.hidden_size,
                                          args.moe_intermediate_size * args.n_shared_experts,
                                          args.hidden_act), "shared_experts")
            return SparseMoE(args.hidden_size, args.moe_intermediate_size, args.n_routed_experts,
                             args.num_experts_per_tok, shared=shared)

        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, projections=Projections(bias=args.attention_bias)),
                mlp(i), norm,
            )
            for i in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.n_routed_experts)
        return weights
