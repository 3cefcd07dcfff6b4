"""Cohere Command-R: one bias-free LayerNorm feeding attention and MLP in parallel,
interleaved RoPE, optional per-head QK LayerNorm, tied output scaled by
``logit_scale``."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import (MLP, Attention, CausalLM, DecoderStack, HeadwiseLayerNorm, LayerNorm,
                     ParallelBlock)
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
    hidden_act: str = "silu"
    layer_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    logit_scale: float = 0.0625
    use_qk_norm: bool = False
    attention_bias: bool = False
    tie_word_embeddings: bool = True


class Model(CausalLM):
    def __init__(self, args: ModelArgs, windows=None):
        """``windows``: per layer, None for a global layer or the sliding window size;
        with windows given only windowed layers are rotated (Cohere 2's global
        layers use no position encoding)."""
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.hidden_size // args.num_attention_heads
        rope = make_rope(head_dim, args.rope_theta, True, args.rope_scaling,
                         args.max_position_embeddings)
        norm = lambda: LayerNorm(args.hidden_size, args.layer_norm_eps, bias=False)
        qk_norm = None
        if args.use_qk_norm:  # a (heads, head_dim) weight, fed the whole projection
            eps = args.layer_norm_eps
            qk_norm = lambda dims: HeadwiseLayerNorm(dims // head_dim, head_dim, eps)
        self.layer_windows = windows or [None] * args.num_hidden_layers
        layers = [
            ParallelBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                          rope if windows is None or w is not None else None,
                          bias=args.attention_bias, qk_norm=qk_norm, qk_norm_full=True),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm, norm_names=("input_layernorm",),
            )
            for w in self.layer_windows
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs) * self.args.logit_scale
