"""OLMo 3: OLMo 2 blocks with sliding-window layers (three of every four unless
``layer_types`` says). RoPE scaling (e.g. YaRN) applies to the global layers only;
windowed layers use plain RoPE."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.rope import make_rope
from .olmo2 import Model as Olmo2Model
from .olmo2 import ModelArgs as Olmo2Args


@dataclass
class ModelArgs(Olmo2Args):
    sliding_window: int = 4096
    layer_types: Optional[List[str]] = None
    rope_local_base_freq: Optional[float] = None  # the sliding layers' theta (per-type configs)

    def __post_init__(self):
        if self.layer_types is None:
            self.layer_types = [
                "full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
                for i in range(self.num_hidden_layers)
            ]


class Model(Olmo2Model):
    def __init__(self, args: ModelArgs):
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        global_rope = make_rope(head_dim, args.rope_theta, False, args.rope_scaling,
                                args.max_position_embeddings)
        local_rope = make_rope(head_dim, args.rope_local_base_freq or args.rope_theta)
        sliding = [t == "sliding_attention" for t in args.layer_types]
        super().__init__(
            args,
            ropes=[local_rope if s else global_rope for s in sliding],
            layer_windows=[args.sliding_window if s else None for s in sliding],
        )
