"""Mellum 2 (JetBrains): Qwen 3 MoE's attention (per-head QK-norm) and experts,
with per-layer attention types (``layer_types``: sliding-window or full, each with
its own RoPE theta under ``rope_parameters``) and per-layer MLP types
(``mlp_layer_types``: ``"dense"`` or ``"sparse"``). The multi-token-prediction
module (``mtp.*``) is dropped."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.rope import make_rope
from . import qwen3_moe
from .common import config_rope, type_windows


@dataclass
class ModelArgs(qwen3_moe.ModelArgs):
    num_local_experts: Optional[int] = 64  # transformers' name; num_experts wins when given
    moe_intermediate_size: int = 896
    norm_topk_prob: bool = True
    head_dim: Optional[int] = 128
    rope_theta: float = 500_000.0  # full-attention layers
    rope_local_base_freq: float = 10_000.0  # sliding-window layers
    rope_parameters_by_type: Optional[dict] = None
    sliding_window: Optional[int] = 1024
    mlp_layer_types: Optional[List[str]] = None

    def __post_init__(self):
        super().__post_init__()
        self.layer_types = self.layer_types or ["full_attention"] * self.num_hidden_layers
        self.mlp_layer_types = self.mlp_layer_types or ["sparse"] * self.num_hidden_layers

    def is_moe_layer(self, i):
        return self.mlp_layer_types[i] == "sparse"

    def layer_windows(self):
        return type_windows(self.layer_types, self.sliding_window)

    def sliding_rope_scaling(self):
        """The sliding layers' own RoPE scaling (None for the default rotation)."""
        local = (self.rope_parameters_by_type or {}).get("sliding_attention") or {}
        if local.get("rope_type", "default") == "default":
            return None
        return {k: v for k, v in local.items() if k != "rope_theta"}


class Model(qwen3_moe.Model):
    def __init__(self, args: ModelArgs):
        full = config_rope(args, args.head_dim)
        local = make_rope(args.head_dim, args.rope_local_base_freq, False,
                          args.sliding_rope_scaling(), args.max_position_embeddings)
        super().__init__(args, layer_ropes=[local if t == "sliding_attention" else full
                                            for t in args.layer_types])

    def sanitize(self, weights):
        return super().sanitize({k: v for k, v in weights.items() if not k.startswith("mtp.")})
