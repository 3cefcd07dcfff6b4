"""SmolLM 3: llama blocks where some layers use no positional encoding at all
(``no_rope_layers[i] == 0``: by default every fourth layer), with optional sliding
windows on the layers ``layer_types`` marks when ``use_sliding_window``."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    rope_theta: float = 2_000_000.0
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
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                          rope if use_rope else None,
                          projections=Projections(bias=args.attention_bias)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.mlp_bias),
                norm,
            )
            for use_rope in args.no_rope_layers
        ]
        windowed = args.use_sliding_window and args.sliding_window and args.layer_types
        init_causal_lm(self, args, layers, norm(), [
            args.sliding_window if windowed and t == "sliding_attention" else None
            for t in (args.layer_types or [None] * args.num_hidden_layers)
        ])
