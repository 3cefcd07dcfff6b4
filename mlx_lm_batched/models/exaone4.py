"""EXAONE 4: OLMo-2-style post-norm blocks with per-head RMS QK-norm, and (when a
sliding window is configured) windowed layers with RoPE interleaved with global
layers that use no positional encoding."""

from dataclasses import dataclass
from typing import List, Optional, Union

from ..layers.attention import Attention
from ..layers.attention_options import QKNorm
from ..layers.blocks import SandwichBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm
from .olmo2 import POST_NORMS


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-5
    sliding_window: Optional[int] = 4096
    sliding_window_pattern: Optional[Union[int, str]] = 4
    layer_types: Optional[List[str]] = None

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
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        sliding = [t == "sliding_attention" for t in args.layer_types]
        layers = [
            SandwichBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                          rope if args.sliding_window is None or s else None, qk_norm=QKNorm(norm)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
                norm_names=POST_NORMS,
            )
            for s in sliding
        ]
        init_causal_lm(self, args, layers, norm(),
                       [args.sliding_window if s else None for s in sliding])
