"""Qwen 2 (and 2.5): llama blocks with biased q/k/v projections (o_proj unbiased).

The optional sliding window applies only to layers from ``max_window_layers`` on
(or to the layers ``layer_types`` marks), and only when ``use_sliding_window``.
"""

from dataclasses import dataclass
from typing import List, Optional

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
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    attention_bias: bool = False  # Qwen 3's bias flag (all four projections)
    use_sliding_window: bool = False
    sliding_window: Optional[int] = None
    max_window_layers: int = 0
    layer_types: Optional[List[str]] = None

    def __post_init__(self):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads

    def layer_windows(self):
        if not (self.use_sliding_window and self.sliding_window):
            return [None] * self.num_hidden_layers
        types = self.layer_types or [
            "sliding_attention" if i >= self.max_window_layers else "full_attention"
            for i in range(self.num_hidden_layers)
        ]
        return [self.sliding_window if t == "sliding_attention" else None for t in types]


class Model(CausalLM):
    def __init__(self, args: ModelArgs, attention_kwargs=None):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        rope = make_rope(args.head_dim, args.rope_theta, False, args.rope_scaling,
                         args.max_position_embeddings)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        attention_kwargs = attention_kwargs or dict(bias=True, o_bias=False)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, **attention_kwargs),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = args.layer_windows()
