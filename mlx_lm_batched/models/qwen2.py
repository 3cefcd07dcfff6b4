"""Qwen 2 (and 2.5): llama blocks with biased q/k/v projections (o_proj unbiased).

The optional sliding window applies only to layers from ``max_window_layers`` on
(or to the layers ``layer_types`` marks), and only when ``use_sliding_window``.
"""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm, type_windows


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False  # Qwen 3's bias flag (all four projections)
    use_sliding_window: bool = False
    sliding_window: Optional[int] = None
    max_window_layers: int = 0
    layer_types: Optional[List[str]] = None

    def layer_windows(self):
        if not (self.use_sliding_window and self.sliding_window):
            return [None] * self.num_hidden_layers
        types = self.layer_types or [
            "sliding_attention" if i >= self.max_window_layers else "full_attention"
            for i in range(self.num_hidden_layers)
        ]
        return type_windows(types, self.sliding_window)


class Model(CausalLM):
    def __init__(self, args: ModelArgs, attention_kwargs=None):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        attention_kwargs = attention_kwargs or dict(
            projections=Projections(bias=True, o_bias=False))
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, **attention_kwargs),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(),
                       args.layer_windows())
