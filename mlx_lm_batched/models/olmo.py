"""OLMo (1): llama blocks whose LayerNorms have no weight or bias, optional clamping
of the q/k/v projections (``clip_qkv``), and untied or tied output."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    attention_bias: bool = False
    clip_qkv: Optional[float] = None


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        # OlmoLayerNorm: eps 1e-5, no learnable parameters.
        norm = lambda: nn.LayerNorm(args.hidden_size, eps=1e-5, affine=False)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope,
                          projections=Projections(bias=args.attention_bias, clip=args.clip_qkv)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())
