"""Mixtral: Mistral blocks whose MLP is ``block_sparse_moe``, a softmax top-k router
(weights renormalised over the chosen experts) over SwiGLU experts ``w1``/``w3``/``w2``."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.blocks import PreNormBlock
from ..layers.mlp import activation
from ..layers.moe import SparseMoE, stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm

MIXTRAL_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@dataclass
class ModelArgs(DecoderArgs):
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: Optional[int] = None


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope),
                SparseMoE(args.hidden_size, args.intermediate_size, args.num_local_experts,
                          args.num_experts_per_tok, activation(args.hidden_act), normalize=True),
                norm,
                mlp_name="block_sparse_moe",
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(),
                       [args.sliding_window] * args.num_hidden_layers)

    def sanitize(self, weights):
        return stack_mixtral_experts(super().sanitize(weights), self.args)


def stack_mixtral_experts(weights, args):
    """Stack each layer's ``block_sparse_moe.experts.{e}.w1/w3/w2`` (Mixtral, PhiMoE)."""
    for i in range(args.num_hidden_layers):
        stack_experts(weights, f"model.layers.{i}.block_sparse_moe", args.num_local_experts,
                      MIXTRAL_EXPERT_NAMES)
    return weights
