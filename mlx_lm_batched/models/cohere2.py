"""Cohere 2 (Command R7B, Command A): Cohere blocks where sliding-window layers use
RoPE and every ``sliding_window_pattern``-th layer is global with no position
encoding."""

from dataclasses import dataclass
from typing import List, Optional

from . import cohere
from .common import type_windows


@dataclass
class ModelArgs(cohere.ModelArgs):
    # mlx-lm's defaults for the sizes a config leaves out (Command R7B's).
    model_type: str = "cohere2"
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    intermediate_size: Optional[int] = None  # 4 x hidden_size (DecoderArgs)
    num_attention_heads: int = 32
    num_key_value_heads: Optional[int] = 8
    sliding_window: int = 4096
    sliding_window_pattern: int = 4
    layer_types: Optional[List[str]] = None

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:
            p = self.sliding_window_pattern
            self.layer_types = [
                "full_attention" if (i + 1) % p == 0 else "sliding_attention"
                for i in range(self.num_hidden_layers)
            ]


class Model(cohere.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, windows=type_windows(args.layer_types, args.sliding_window))
