"""EXAONE 4: OLMo-2-style post-norm blocks with per-head RMS QK-norm, and (when a
sliding window is configured) windowed layers with RoPE interleaved with global
layers that use no positional encoding."""

from dataclasses import dataclass
from typing import List, Optional, Union

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import MLP, Attention, CausalLM, DecoderStack, RMSNorm, SandwichBlock
from .olmo2 import POST_NORMS
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
    rms_norm_eps: float = 1e-5
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    hidden_act: str = "silu"
    sliding_window: Optional[int] = 4096
    sliding_window_pattern: Optional[Union[int, str]] = 4
    layer_types: Optional[List[str]] = None
    tie_word_embeddings: bool = False

    def __post_init__(self):
        if self.layer_types is not None:
            return
        n, pattern = self.num_hidden_layers, self.sliding_window_pattern
        if self.sliding_window is None or not pattern:
            self.layer_types = ["full_attention"] * n
        elif isinstance(pattern, str):  # e.g. "LLLG": local, local, local, global
            self.layer_types = [
                "sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"
                for i in range(n)
            ]
        else:
            self.layer_types = [
                "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)
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
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        sliding = [t == "sliding_attention" for t in args.layer_types]
        layers = [
            SandwichBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                          rope if args.sliding_window is None or s else None, qk_norm=norm),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
                norm_names=POST_NORMS,
            )
            for s in sliding
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [args.sliding_window if s else None for s in sliding]
