"""Gemma 2: Gemma with sandwich norms, soft-capped attention and output logits,
queries scaled by ``query_pre_attn_scalar ** -0.5``, and sliding-window layers
alternating with global ones (even layers slide unless ``layer_types`` says)."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections, Scores
from ..layers.blocks import SandwichBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from . import gemma
from .common import attention_dims, config_rope, init_causal_lm, type_windows
from .gemma import gemma_activation


@dataclass
class ModelArgs(gemma.ModelArgs):
    query_pre_attn_scalar: float = 256
    sliding_window: Optional[int] = 4096
    layer_types: Optional[List[str]] = None
    attn_logit_softcapping: Optional[float] = 50.0
    final_logit_softcapping: Optional[float] = 30.0

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:
            self.layer_types = [
                "sliding_attention" if (i + 1) % 2 else "full_attention"
                for i in range(self.num_hidden_layers)
            ]


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps, zero_centered=True)
        act = gemma_activation(args.hidden_activation, args.hidden_act)
        layers = [
            SandwichBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          projections=Projections(bias=args.attention_bias),
                          scores=Scores(scale=args.query_pre_attn_scalar**-0.5,
                                        softcap=args.attn_logit_softcapping)),
                MLP(args.hidden_size, args.intermediate_size, act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), type_windows(args.layer_types, args.sliding_window), embed_scale=args.hidden_size**0.5)
        self.final_logit_softcap = args.final_logit_softcapping
