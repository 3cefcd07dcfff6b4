"""PLaMo 3 (Preferred Networks): sandwich blocks (norms before and after attention
and MLP) whose RMS norms scale by ``weight + offset`` (1 before each sublayer and on
the QK-norms, 1/5 after attention, 1/5**1.5 after the MLP, 1 on the final norm), a
fused ``qkv_proj`` with per-head QK-norm, a fused gated MLP, and every
``sliding_window_pattern``-th layer global (the others sliding-window with their own
RoPE theta).

A sliding layer sees ``window_size + 1`` keys (itself and ``window_size`` before it),
as mlx-lm's mask does. Checkpoint names nest the blocks as
``model.layers.layers.{i}.mixer``; ``sanitize`` maps them to the shared layers'."""

import re
from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import SandwichBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs, require_values
from .common import init_causal_lm

NORM_NAMES = ("pre_mixer_norm", "post_mixer_norm", "pre_mlp_norm", "post_mlp_norm")
NORM_OFFSETS = (1.0, 1.0 / 5, 1.0, 1.0 / 5**1.5)  # in NORM_NAMES' order


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    head_dim: int = 128
    max_position_embeddings: int = 2048
    window_size: int = 2048
    sliding_window: Optional[int] = None
    sliding_window_pattern: int = 8
    rope_theta: float = 1_000_000.0
    rope_local_theta: float = 10_000.0
    intermediate_size: int = 13312
    vocab_size: int = 32000
    # mlx-lm's fields for PLaMo 3's image input and linear variants: text only here, with
    # plain linear layers.
    image_token_id: Optional[int] = None
    image_feature_size: Optional[int] = None
    image_proj_type: str = "linear"
    linear_type: str = "normal"

    def __post_init__(self):
        require_values(self, linear_type=("normal",))
        if self.sliding_window is not None:
            self.window_size = self.sliding_window

    def is_global(self, i):
        return (i + 1) % self.sliding_window_pattern == 0


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, hd = args.hidden_size, args.head_dim
        ropes = (make_rope(hd, args.rope_local_theta), make_rope(hd, args.rope_theta))
        norm = lambda dims=d, offset=1.0: RMSNorm(dims, args.rms_norm_eps, offset=offset)

        def block(i):
            offsets = iter(NORM_OFFSETS)  # SandwichBlock makes its norms in NORM_NAMES' order
            return SandwichBlock(
                Attention(d, args.num_attention_heads, args.num_key_value_heads, hd,
                          ropes[args.is_global(i)], qk_norm=QKNorm(norm),
                          projections=Projections(fused_qkv=True)),
                MLP(d, args.intermediate_size, fused_gate_up=True),
                lambda: norm(offset=next(offsets)), norm_names=NORM_NAMES)

        n = args.num_hidden_layers
        init_causal_lm(self, args, [block(i) for i in range(n)], norm(),
                       [None if args.is_global(i) else args.window_size + 1 for i in range(n)])

    def sanitize(self, weights):
        weights = {re.sub(r"^model\.layers\.layers\.(\d+)\.(mixer\.)?",
                          lambda m: f"model.layers.{m[1]}." + ("self_attn." if m[2] else ""), k): v
                   for k, v in weights.items()}
        return super().sanitize(weights)
