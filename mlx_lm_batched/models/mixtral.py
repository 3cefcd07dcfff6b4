"""Mixtral: Mistral blocks whose MLP is ``block_sparse_moe``, a softmax top-k router
(weights renormalised over the chosen experts) over SwiGLU experts ``w1``/``w3``/``w2``."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import Attention, CausalLM, DecoderStack, PreNormBlock, RMSNorm, activation
from .moe import SparseMoE, stack_experts
from .rope import make_rope

MIXTRAL_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    rms_norm_eps: float = 1e-5
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 1e6
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    sliding_window: Optional[int] = None


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        rope = make_rope(head_dim, args.rope_theta, False, args.rope_scaling,
                         args.max_position_embeddings)
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
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [args.sliding_window] * args.num_hidden_layers

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            stack_experts(weights, f"model.layers.{i}.block_sparse_moe",
                          self.args.num_local_experts, MIXTRAL_EXPERT_NAMES)
        return weights
