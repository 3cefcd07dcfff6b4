"""Bailing hybrid (inclusionAI's Ling / Ring 2.5, ``BailingMoeV2_5ForCausalLM``): Bailing
Linear's lightning-attention layers with multi-head latent attention (DeepSeek's MLA,
``KVCache``) as the softmax layers, and Bailing's grouped sigmoid router."""

from dataclasses import dataclass
from typing import Optional

from ..layers.mla import (LatentDims, MultiHeadLatentAttention, merge_absorbed_kv_b,
                          mla_softmax_scale)
from ..layers.rope import make_rope
from . import bailing_moe_linear


@dataclass
class ModelArgs(bailing_moe_linear.ModelArgs):
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    q_lora_rank: Optional[int] = None
    rope_interleave: bool = True
    partial_rotary_factor: float = 0.5
    use_qk_norm: bool = True
    score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    num_nextn_predict_layers: int = 0

    def __post_init__(self):
        super().__post_init__()
        dims = int(self.head_dim * self.partial_rotary_factor)
        if dims <= 0 or dims > self.head_dim or dims % 2:
            raise ValueError(f"invalid rotary dimension {dims} for head_dim {self.head_dim}")

    dropped_group_score = float("-inf")

    def shared_experts_size(self):
        # Unlike Bailing MoE's, the configured size is already that of all the shared
        # experts together.
        return self.moe_shared_expert_intermediate_size or \
            self.moe_intermediate_size * self.num_shared_experts


class Model(bailing_moe_linear.Model):
    def mixer(self, args, i, norm):
        if not args.is_softmax_layer(i):
            return self.linear_mixer(args, i, norm, args.head_dim, i)
        rope = make_rope(args.qk_rope_head_dim, args.rope_theta, args.rope_interleave,
                         args.rope_scaling, args.max_position_embeddings)
        scale = mla_softmax_scale(args.qk_nope_head_dim + args.qk_rope_head_dim,
                                  args.rope_scaling)
        return MultiHeadLatentAttention(
            args.hidden_size, args.num_attention_heads, LatentDims.from_args(args),
            rope, scale, args.use_qkv_bias)

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_softmax_layer(i):  # mlx-lm's absorbed MLA matrices
                merge_absorbed_kv_b(weights, f"model.layers.{i}.self_attn",
                                    self.args.qk_nope_head_dim, self.args.kv_lora_rank)
        return weights
