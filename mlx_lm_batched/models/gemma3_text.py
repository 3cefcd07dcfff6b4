"""Gemma 3 (text): sandwich norms with ``1 + w``, QK-norm, scaled embeddings, tied
output, and five sliding-window layers per global layer with their own RoPE base."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm, Scores
from ..layers.blocks import SandwichBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM, DecoderStack
from . import gemma
from .common import type_windows


@dataclass
class ModelArgs(gemma.ModelArgs):
    vocab_size: int = 262144
    num_key_value_heads: int = 1
    query_pre_attn_scalar: float = 256
    sliding_window: int = 512
    sliding_window_pattern: int = 6
    layer_types: Optional[List[str]] = None
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    max_position_embeddings: int = 32768
    hidden_activation: str = "gelu_pytorch_tanh"
    attn_logit_softcapping: Optional[float] = None
    final_logit_softcapping: Optional[float] = None

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:
            p = self.sliding_window_pattern
            self.layer_types = [
                "full_attention" if (i + 1) % p == 0 else "sliding_attention"
                for i in range(self.num_hidden_layers)
            ]


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps, zero_centered=True)
        global_rope = make_rope(args.head_dim, args.rope_theta, False, args.rope_scaling,
                                args.max_position_embeddings)
        local_rope = make_rope(args.head_dim, args.rope_local_base_freq)
        layers = []
        for kind in args.layer_types:
            attn = Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                             args.head_dim, global_rope if kind == "full_attention" else local_rope,
                             qk_norm=QKNorm(norm),
                             projections=Projections(bias=args.attention_bias),
                             scores=Scores(scale=args.query_pre_attn_scalar**-0.5,
                                           softcap=args.attn_logit_softcapping))
            mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_activation)
            layers.append(SandwichBlock(attn, mlp, norm))
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm(),
                                  embed_scale=args.hidden_size**0.5)
        self.final_logit_softcap = args.final_logit_softcapping
        self.layer_windows = type_windows(args.layer_types, args.sliding_window)
