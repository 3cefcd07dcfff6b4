"""DeepSeek V2: multi-head latent attention, and MoE blocks (softmax top-k routing,
optionally group-limited, plus always-on shared experts) after the first
``first_k_dense_replace`` dense layers. DeepSeek V3 reuses everything but the router."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.blocks import PreNormBlock
from ..layers.mla import (
    LatentDims,
    MultiHeadLatentAttention,
    merge_absorbed_kv_b,
    mla_softmax_scale,
)
from ..layers.mlp import MLP, activation
from ..layers.moe import SwitchGLU, combine_experts, stack_experts, topk_indices
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    vocab_size: int = 102400
    hidden_size: int = 4096
    intermediate_size: int = 11008
    moe_intermediate_size: int = 1407
    num_hidden_layers: int = 30
    num_attention_heads: int = 32
    n_shared_experts: Optional[int] = None
    n_routed_experts: Optional[int] = None
    routed_scaling_factor: float = 1.0
    kv_lora_rank: int = 512
    q_lora_rank: Optional[int] = 1536
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    qk_nope_head_dim: int = 128
    topk_method: str = "greedy"
    n_group: Optional[int] = None
    topk_group: Optional[int] = None
    num_experts_per_tok: Optional[int] = None
    moe_layer_freq: int = 1
    first_k_dense_replace: int = 0
    norm_topk_prob: bool = False
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    rope_interleave: bool = True  # V3 configs may turn it off; V2 always interleaves
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    quantization_config: Optional[dict] = None  # FP8 block scales (official V3 weights)
    # Checkpoints carry it (equal to num_attention_heads); MLA attention has no KV-head
    # grouping, so it sets nothing, in transformers and mlx-lm alike.
    num_key_value_heads: Optional[int] = None

    def is_moe_layer(self, i):
        return (
            bool(self.n_routed_experts)
            and i >= self.first_k_dense_replace
            and i % self.moe_layer_freq == 0
        )


def limit_to_groups(scores, n_group, topk_group, group_score, fill):
    """Keep the experts of the ``topk_group`` best groups; set the others to ``fill``.

    ``group_score`` maps ``(..., n_group, experts_per_group)`` to ``(..., n_group)``.
    """
    if not n_group or not topk_group or topk_group >= n_group:
        return scores
    grouped = scores.reshape(*scores.shape[:-1], n_group, -1)
    best = topk_indices(group_score(grouped), topk_group)
    keep = mx.put_along_axis(mx.zeros(best.shape[:-1] + (n_group,), mx.bool_), best,
                             mx.array(True), axis=-1)
    grouped = mx.where(keep[..., None], grouped, mx.array(fill, scores.dtype))
    return grouped.reshape(scores.shape)


def dequantize_fp8_blocks(weights, block_size=(128, 128)):
    """Replace FP8 ``weight`` + ``weight_scale_inv`` pairs (one scale per block, as in
    DeepSeek's own checkpoints) by bfloat16 weights."""
    bm, bn = block_size
    for key in [k for k in weights if k.endswith(".weight_scale_inv")]:
        scale = weights.pop(key).astype(mx.float32)
        name = key[: -len("_scale_inv")]
        w = mx.from_fp8(weights[name], dtype=mx.float32)
        m, n = w.shape
        w = mx.pad(w, ((0, -m % bm), (0, -n % bn)))
        w = w.reshape(scale.shape[0], bm, scale.shape[1], bn) * scale[:, None, :, None]
        weights[name] = w.reshape(w.shape[0] * bm, -1)[:m, :n].astype(mx.bfloat16)
    return weights


class SoftmaxGate(nn.Module):
    """V2 router: softmax over float32 logits, top-k (greedy or group-limited)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.weight = mx.zeros((args.n_routed_experts, args.hidden_size))
        self.top_k = args.num_experts_per_tok
        self.group_limited = args.topk_method == "group_limited_greedy"
        self.n_group, self.topk_group = args.n_group, args.topk_group
        self.scaling = args.routed_scaling_factor
        self.norm_topk_prob = args.norm_topk_prob

    def __call__(self, x):
        logits = x.astype(mx.float32) @ self.weight.astype(mx.float32).T
        scores = mx.softmax(logits, axis=-1, precise=True)
        choice = scores
        if self.group_limited:
            choice = limit_to_groups(scores, self.n_group, self.topk_group,
                                     lambda g: g.max(axis=-1), 0.0)
        indices = topk_indices(choice, self.top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        if self.top_k > 1 and self.norm_topk_prob:
            # DeepSeek's own code: normalised weights replace the scaling factor.
            return indices, weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
        return indices, weights * self.scaling


class DeepseekMoE(nn.Module):
    """Routed experts (weighted by the gate) plus always-on shared experts."""

    def __init__(self, args: ModelArgs, gate):
        super().__init__()
        self.gate = gate
        self.switch_mlp = SwitchGLU(args.hidden_size, args.moe_intermediate_size,
                                    args.n_routed_experts, activation(args.hidden_act))
        if args.n_shared_experts:
            self.shared_experts = MLP(args.hidden_size,
                                      args.moe_intermediate_size * args.n_shared_experts,
                                      args.hidden_act, args.mlp_bias)

    def __call__(self, x):
        indices, weights = self.gate(x)
        y = combine_experts(self.switch_mlp(x, indices), weights, x.dtype)
        if "shared_experts" in self:
            y = y + self.shared_experts(x)
        return y


class Model(CausalLM):
    def __init__(self, args: ModelArgs, gate=SoftmaxGate, position_scale=None):
        """``gate(args)`` builds each MoE layer's router (V3 passes its own);
        ``position_scale``: the attention's query temperature (Mistral 4)."""
        super().__init__()
        interleaved = args.rope_interleave or args.model_type == "deepseek_v2"
        # DeepSeek rotates adjacent pairs (traditional). transformers' V3 de-interleaves
        # them when rope_interleave, but queries and keys get the same permutation, so
        # their dot products equal the traditional rotation.
        rope = make_rope(args.qk_rope_head_dim, args.rope_theta, interleaved, args.rope_scaling,
                         args.max_position_embeddings)
        scale = mla_softmax_scale(args.qk_nope_head_dim + args.qk_rope_head_dim, args.rope_scaling)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = []
        for i in range(args.num_hidden_layers):
            attn = self.make_attention(args, rope, scale, position_scale)
            if args.is_moe_layer(i):
                mlp = DeepseekMoE(args, gate(args))
            else:
                mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.mlp_bias)
            layers.append(PreNormBlock(attn, mlp, norm))
        init_causal_lm(self, args, layers, norm())

    def make_attention(self, args, rope, scale, position_scale):
        """One layer's attention (DeepSeek V3.2 adds its sparse indexer)."""
        return MultiHeadLatentAttention(
            args.hidden_size, args.num_attention_heads, LatentDims.from_args(args),
            rope, scale, args.attention_bias, position_scale=position_scale,
        )

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        qc = self.args.quantization_config or {}
        if qc.get("quant_method") == "fp8":
            weights = dequantize_fp8_blocks(weights, qc.get("weight_block_size") or (128, 128))
        n = self.args.num_hidden_layers
        # Drop layers past the decoder (V3's multi-token-prediction modules).
        weights = {
            k: v for k, v in weights.items()
            if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= n)
        }
        for i in range(n):
            merge_absorbed_kv_b(weights, f"model.layers.{i}.self_attn",
                                self.args.qk_nope_head_dim, self.args.kv_lora_rank)
            if not self.args.is_moe_layer(i):
                continue
            prefix = f"model.layers.{i}.mlp"
            # Per-expert and transformers 5's fused layouts alike.
            stack_experts(weights, prefix, self.args.n_routed_experts)
        return weights
