"""SmolLM 3: llama blocks where some layers use no positional encoding at all
(``no_rope_layers[i] == 0``: by default every fourth layer), with optional sliding
windows on the layers ``layer_types`` marks when ``use_sliding_window``."""

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
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 2_000_000.0
    rope_scaling: Optional[dict] = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    no_rope_layers: Optional[List[int]] = None
    no_rope_layer_interval: int = 4
    use_sliding_window: bool = False
    sliding_window: Optional[int] = None
    layer_types: Optional[List[str]] = None
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.no_rope_layers is None:
            self.no_rope_layers = [
                int((i + 1) % self.no_rope_layer_interval != 0)
                for i in range(self.num_hidden_layers)
            ]


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
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                          rope if use_rope else None, bias=args.attention_bias),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.mlp_bias),
                norm,
            )
            for use_rope in args.no_rope_layers
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        windowed = args.use_sliding_window and args.sliding_window and args.layer_types
        self.layer_windows = [
            args.sliding_window if windowed and t == "sliding_attention" else None
            for t in (args.layer_types or [None] * args.num_hidden_layers)
        ]
