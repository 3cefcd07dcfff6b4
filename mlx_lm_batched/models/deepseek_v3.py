"""DeepSeek V3: DeepSeek V2's model with a sigmoid router whose choice (not weights)
is biased by ``e_score_correction_bias`` and limited to the best groups of experts."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.moe import topk_indices
from . import deepseek_v2
from .args import require_values
from .deepseek_v2 import limit_to_groups


@dataclass
class ModelArgs(deepseek_v2.ModelArgs):
    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    n_shared_experts: Optional[int] = 1
    n_routed_experts: Optional[int] = 256
    routed_scaling_factor: float = 2.5
    n_group: Optional[int] = 8
    topk_group: Optional[int] = 4
    num_experts_per_tok: Optional[int] = 8
    first_k_dense_replace: int = 3
    norm_topk_prob: bool = True
    max_position_embeddings: int = 4096
    scoring_func: str = "sigmoid"  # mlx-lm's field: V3's router (SigmoidGate)

    def __post_init__(self):
        require_values(self, scoring_func=("sigmoid",))


class SigmoidGate(nn.Module):
    """V3 router ("noaux_tc"): sigmoid scores; groups ranked by the sum of their two
    best biased scores; top-k over the kept groups' biased scores; weights are the
    unbiased scores, optionally normalised, times ``routed_scaling_factor``."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.weight = mx.zeros((args.n_routed_experts, args.hidden_size))
        self.e_score_correction_bias = mx.zeros((args.n_routed_experts,))
        self.top_k = args.num_experts_per_tok
        self.n_group, self.topk_group = args.n_group, args.topk_group
        self.scaling = args.routed_scaling_factor
        self.norm_topk_prob = args.norm_topk_prob

    def __call__(self, x):
        logits = x.astype(mx.float32) @ self.weight.astype(mx.float32).T
        scores = mx.sigmoid(logits)
        choice = scores + self.e_score_correction_bias.astype(mx.float32)
        choice = limit_to_groups(choice, self.n_group, self.topk_group,
                                 lambda g: mx.topk(g, 2, axis=-1).sum(axis=-1), -mx.inf)
        indices = topk_indices(choice, self.top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
        return indices, weights * self.scaling


class Model(deepseek_v2.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, gate=SigmoidGate)
