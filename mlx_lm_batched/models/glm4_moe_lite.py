"""GLM-4.7-Flash (``glm4_moe_lite``): DeepSeek V3's latent attention and sigmoid
group router, with dense or sparse MLPs chosen per layer by ``mlp_layer_types``
(default: the first layer dense, the rest sparse)."""

from dataclasses import dataclass
from typing import List, Optional

from . import deepseek_v3
from .args import require_values


@dataclass
class ModelArgs(deepseek_v3.ModelArgs):
    n_group: Optional[int] = 1
    topk_group: Optional[int] = 1
    routed_scaling_factor: float = 1.8
    mlp_layer_types: Optional[List[str]] = None
    partial_rotary_factor: float = 1.0  # mlx-lm's field; the rope covers qk_rope_head_dim
    # Accepted as mlx-lm does: training-only dropout, multi-token-prediction layers
    # (their weights are dropped at load) and mlx-lm's quantization (read by the loader).
    attention_dropout: float = 0.0
    num_nextn_predict_layers: int = 1
    quantization: Optional[dict] = None

    def __post_init__(self):
        super().__post_init__()
        require_values(self, partial_rotary_factor=(1.0,))

    def is_moe_layer(self, i):
        if self.mlp_layer_types is None:
            return bool(self.n_routed_experts) and i >= 1
        return self.mlp_layer_types[i] == "sparse"


Model = deepseek_v3.Model
