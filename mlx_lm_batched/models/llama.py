"""Llama (and Mistral, SmolLM2, ...): pre-norm blocks, GQA, SwiGLU, RoPE.

Variants that differ only in config defaults (Helium, Seed-OSS, ERNIE 4.5)
subclass ``ModelArgs`` and reuse ``Model``."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import (
    DecoderArgs,
    attention_dims,
    check_layer_types,
    config_rope,
    init_causal_lm,
    type_windows,
)


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    attention_out_bias: Optional[bool] = None  # o_proj's bias; None: attention_bias
    mlp_bias: bool = False
    rope_traditional: bool = False  # interleaved rotary pairs
    tie_word_embeddings: bool = True
    sliding_window: Optional[int] = None
    # Per-layer kinds ("full_attention" / "sliding_attention"); None: sliding_window
    # (if any) on every layer, as Mistral-style configs mean it.
    layer_types: Optional[List[str]] = None

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is not None:
            check_layer_types(self, ("full_attention", "sliding_attention"))

    def layer_windows(self):
        """The attention window of each layer (None: global)."""
        if self.layer_types is None:
            return [self.sliding_window] * self.num_hidden_layers
        return type_windows(self.layer_types, self.sliding_window)


class Model(CausalLM):
    def __init__(self, args: ModelArgs, attention_kwargs=None, attention_class=Attention,
                 mlp=None):
        """``attention_kwargs``: extra options of every layer's ``Attention``;
        ``attention_class``: its class (BitNet's sub-normed one); ``mlp``: a factory
        of each layer's MLP (default the gated ``MLP``)."""
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim, args.rope_traditional)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                attention_class(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                                projections=Projections(bias=args.attention_bias,
                                                        o_bias=args.attention_out_bias),
                                **(attention_kwargs or {})),
                mlp() if mlp else MLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                                      args.mlp_bias),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), args.layer_windows())
