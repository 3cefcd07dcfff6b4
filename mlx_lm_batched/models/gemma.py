"""Gemma: llama blocks with zero-centered RMS norms (``1 + w``), embeddings scaled by
``sqrt(hidden_size)``, tanh-approximated GELU gating and a tied output layer."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import MLP, Attention, CausalLM, DecoderStack, PreNormBlock, RMSNorm
from .rope import make_rope


def gemma_activation(hidden_activation, hidden_act):
    # Gemma checkpoints say "gelu" but were trained with the tanh approximation;
    # transformers maps it the same way.
    act = hidden_activation or hidden_act or "gelu_pytorch_tanh"
    return "gelu_pytorch_tanh" if act == "gelu" else act


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int = 256000
    head_dim: int = 256
    num_key_value_heads: Optional[int] = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 8192
    hidden_act: Optional[str] = None
    hidden_activation: Optional[str] = None
    attention_bias: bool = False
    tie_word_embeddings: bool = True


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        rope = make_rope(args.head_dim, args.rope_theta, False, args.rope_scaling,
                         args.max_position_embeddings)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps, zero_centered=True)
        act = gemma_activation(args.hidden_activation, args.hidden_act)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, args.head_dim, rope,
                          bias=args.attention_bias),
                MLP(args.hidden_size, args.intermediate_size, act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm(),
                                  embed_scale=args.hidden_size**0.5)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [None] * args.num_hidden_layers
