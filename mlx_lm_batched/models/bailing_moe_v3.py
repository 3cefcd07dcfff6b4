"""Bailing MoE V3 (inclusionAI's Ling / Ring V3; a ``bailing_hybrid`` config whose
architecture is ``BailingMoeV3ForCausalLM`` loads here too): Kimi-style delta attention
(``StateCache``) with a lower-bounded per-channel forget gate, and every
``layer_group_size``-th layer multi-head latent attention with a sigmoid gate per head
(``KVCache``); Bailing's sigmoid router over groups of experts with shared experts.

Each delta-attention layer convolves q, k and v separately (its ``StateCache`` holds
``[q conv inputs, k conv inputs, v conv inputs, delta state]``); its forget gate is
``lower_bound * sigmoid(exp(A_log) * (f_proj(x) + dt_bias))`` in log space."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.state import StateCache
from ..layers.gated_delta import gated_delta_rule, l2_normalize
from ..layers.mla import (LatentDims, MultiHeadLatentAttention, merge_absorbed_kv_b,
                          mla_softmax_scale)
from ..layers.rope import make_rope
from ..layers.ssm import CausalConv1d, GatedRMSNorm, base_cache, column_validity
from . import bailing_moe


@dataclass
class ModelArgs(bailing_moe.ModelArgs):
    # mlx-lm's defaults (Ling V3's sizes) for every field a config may omit.
    model_type: str = "bailing_hybrid"
    vocab_size: int = 157184
    hidden_size: int = 1536
    intermediate_size: int = 4608
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    moe_intermediate_size: Optional[int] = 512
    moe_shared_expert_intermediate_size: Optional[int] = 512
    num_experts: Optional[int] = 128
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    first_k_dense_replace: int = 1
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    layer_group_size: int = 4
    head_dim: Optional[int] = 128
    q_lora_rank: Optional[int] = 256
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    short_conv_kernel_size: int = 4
    kda_lower_bound: float = -5.0
    kda_safe_gate: bool = True
    no_kda_lora: bool = True
    rope_theta: float = 6000000.0
    max_position_embeddings: Optional[int] = 131072
    rope_interleave: bool = True
    score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    router_dtype: Optional[str] = "fp32"

    def __post_init__(self):
        super().__post_init__()
        for flag, need in (("no_kda_lora", True), ("kda_safe_gate", True),
                           ("rope_interleave", True)):
            if getattr(self, flag) != need:
                raise NotImplementedError(f"Bailing V3 with {flag}={getattr(self, flag)} "
                                          "is not supported")

    dropped_group_score = float("-inf")

    def renormalizes_choices(self):
        # V3 divides by the sum also for a single choice (its weight becomes 1).
        return self.norm_topk_prob

    def is_softmax_layer(self, i):
        """Every ``layer_group_size``-th layer and those past the last whole group."""
        g, n = self.layer_group_size, self.num_hidden_layers
        return (i + 1) % g == 0 or i >= n // g * g


class DeltaAttention(nn.Module):
    """Bailing V3's Kimi delta attention: full-rank forget gate (``f_proj``) and output
    gate (``g_proj``), separate short convolutions of q, k and v."""

    def __init__(self, hidden_size, heads, head_dim, kernel, lower_bound, eps):
        super().__init__()
        self.sizes = (heads, head_dim)
        self.lower_bound = lower_bound
        dim = heads * head_dim
        for name in ("q", "k", "v"):
            setattr(self, f"{name}_proj", nn.Linear(hidden_size, dim, bias=False))
            setattr(self, f"{name}_conv1d", CausalConv1d(dim, kernel, bias=False))
        self.A_log = mx.zeros((heads,))
        self.f_proj = nn.Linear(hidden_size, dim, bias=False)
        self.dt_bias = mx.zeros((dim,))
        self.b_proj = nn.Linear(hidden_size, heads, bias=False)
        self.g_proj = nn.Linear(hidden_size, dim, bias=False)
        self.o_norm = GatedRMSNorm(head_dim, eps=eps, norm_before_gate=True, gate_act="sigmoid")
        self.o_proj = nn.Linear(dim, hidden_size, bias=False)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        H, D = self.sizes
        B, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        heads = []
        for i, name in enumerate(("q", "k", "v")):
            h, conv = self[f"{name}_conv1d"](self[f"{name}_proj"](x),
                                              None if state is None else state[i], valid)
            if state is not None:
                state[i] = conv
            heads.append(nn.silu(h).reshape(B, L, H, D))
        q, k, v = heads
        f = self.f_proj(x).reshape(B, L, H, D).astype(mx.float32)
        rate = mx.exp(self.A_log.astype(mx.float32))[:, None]
        g = self.lower_bound * mx.sigmoid(rate * (f + self.dt_bias.reshape(H, D)))
        beta = mx.sigmoid(self.b_proj(x).astype(mx.float32))
        out, delta = gated_delta_rule(l2_normalize(q.astype(mx.float32)),
                                      l2_normalize(k.astype(mx.float32)), v, g, beta,
                                      None if state is None else state[3], valid)
        if state is not None:
            state[3] = delta
            state.advance(L)
        out = self.o_norm(out, self.g_proj(x).reshape(B, L, H, D)).astype(x.dtype)
        return self.o_proj(out.reshape(B, L, -1))


class Model(bailing_moe.Model):
    def mixer(self, args, i, norm):
        if not args.is_softmax_layer(i):
            return DeltaAttention(args.hidden_size, args.num_attention_heads, args.head_dim,
                                  args.short_conv_kernel_size, args.kda_lower_bound,
                                  args.rms_norm_eps)
        rope = make_rope(args.qk_rope_head_dim, args.rope_theta, True, args.rope_scaling,
                         args.max_position_embeddings)
        scale = mla_softmax_scale(args.qk_nope_head_dim + args.qk_rope_head_dim,
                                  args.rope_scaling)
        return MultiHeadLatentAttention(
            args.hidden_size, args.num_attention_heads, LatentDims.from_args(args),
            rope, scale, output_gate=True)

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per delta-attention layer, key/value caches for the MLA ones."""
        caches = super().make_cache(max_kv_size)
        return [c if self.args.is_softmax_layer(i) else StateCache(4)
                for i, c in enumerate(caches)]

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        k = self.args.short_conv_kernel_size
        for name in list(weights):
            if "_conv1d.weight" in name:
                weights[name] = CausalConv1d.sanitize_weight(weights[name], k)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_softmax_layer(i):  # mlx-lm's absorbed MLA matrices
                merge_absorbed_kv_b(weights, f"model.layers.{i}.self_attn",
                                    self.args.qk_nope_head_dim, self.args.kv_lora_rank)
        return weights
