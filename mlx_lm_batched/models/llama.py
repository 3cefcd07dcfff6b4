"""Llama (and Mistral, SmolLM2, ...): pre-norm blocks, GQA, SwiGLU, RoPE."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import MLP, Attention, CausalLM, DecoderStack, PreNormBlock, RMSNorm
from .rope import make_rope


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    attention_bias: bool = False
    mlp_bias: bool = False
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = True
    hidden_act: str = "silu"
    sliding_window: Optional[int] = None


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        rope = make_rope(
            head_dim, args.rope_theta, args.rope_traditional, args.rope_scaling,
            args.max_position_embeddings,
        )
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          bias=args.attention_bias),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.mlp_bias),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        # Mistral-style configs carry one window for every layer.
        self.layer_windows = [args.sliding_window] * args.num_hidden_layers
