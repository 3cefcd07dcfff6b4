"""Mistral 4: DeepSeek V3's model (multi-head latent attention, shared + routed
experts after ``first_k_dense_replace`` dense layers) with a softmax router (groups
ranked by their two best scores, top-k renormalised, times ``routed_scaling_factor``)
and Ministral 3's query temperature ``1 + beta * log(1 + floor(pos / original))``."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.moe import topk_indices
from . import deepseek_v2, deepseek_v3, ministral3
from .common import apply_rope_parameters
from .deepseek_v2 import limit_to_groups


@dataclass
class ModelArgs(deepseek_v3.ModelArgs):
    vocab_size: int = 131072
    hidden_size: int = 4096
    intermediate_size: int = 12288
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    n_routed_experts: Optional[int] = 128
    routed_scaling_factor: float = 1.0
    kv_lora_rank: int = 256
    q_lora_rank: Optional[int] = 1024
    qk_nope_head_dim: int = 64
    n_group: Optional[int] = 1
    topk_group: Optional[int] = 1
    num_experts_per_tok: Optional[int] = 4
    first_k_dense_replace: int = 0
    max_position_embeddings: int = 1048576
    rope_parameters: Optional[dict] = None
    # mlx-lm's derived sizes, nope + rope by default. A query head is always nope + rope
    # wide here (and in mlx-lm), so a different ``qk_head_dim`` is refused; ``head_dim``
    # sizes nothing in this architecture (mlx-lm keeps it unread too).
    head_dim: Optional[int] = None
    qk_head_dim: Optional[int] = None

    def __post_init__(self):
        # ``ModelArgs(rope_parameters=...)`` (transformers 5's layout) as from_dict reads it:
        # the YaRN settings reach the RoPE and the attention scale.
        apply_rope_parameters(self)
        super().__post_init__()
        width = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.qk_head_dim is None:
            self.qk_head_dim = width
        if self.qk_head_dim != width:
            raise ValueError(f"mistral4: qk_head_dim {self.qk_head_dim} is not "
                             f"qk_nope_head_dim + qk_rope_head_dim = {width}")
        if self.head_dim is None:
            self.head_dim = width

    query_scaling = ministral3.ModelArgs.query_scaling


class SoftmaxGroupGate(nn.Module):
    """Softmax scores; the ``topk_group`` groups with the largest sum of their two best
    scores are kept (the others score 0); weights are the chosen scores, optionally
    renormalised, times ``routed_scaling_factor``."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.weight = mx.zeros((args.n_routed_experts, args.hidden_size))
        self.top_k = args.num_experts_per_tok
        self.n_group, self.topk_group = args.n_group, args.topk_group
        self.scaling = args.routed_scaling_factor
        self.norm_topk_prob = args.norm_topk_prob

    def __call__(self, x):
        logits = x.astype(mx.float32) @ self.weight.astype(mx.float32).T
        scores = mx.softmax(logits, axis=-1, precise=True)
        choice = limit_to_groups(scores, self.n_group, self.topk_group,
                                 lambda g: mx.topk(g, 2, axis=-1).sum(axis=-1), 0.0)
        indices = topk_indices(choice, self.top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
        return indices, weights * self.scaling


class Model(deepseek_v2.Model):
    def __init__(self, args: ModelArgs):
        scaling = args.query_scaling()
        super().__init__(
            args, gate=SoftmaxGroupGate,
            position_scale=ministral3.llama4_query_scale(*scaling) if scaling else None)
