"""Qwen3-Next: a hybrid of gated delta-rule linear attention (``StateCache``) and
output-gated full attention with partial RoPE (``KVCache``), Qwen 2 MoE-style sparse
MLPs (shared expert with a sigmoid gate), and ``1 + w`` RMS norms."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers.attention import Attention, scaled_dot_product_attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.gated_delta import DeltaHeads, GatedDeltaNet
from ..layers.mlp import MLP, activation
from ..layers.moe import SharedExpert, SparseMoE, stack_experts
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d, HybridBlock
from ..layers.stack import CausalLM
from . import qwen2_moe
from .common import config_rope, init_causal_lm

# The zero-centred norms mlx-lm stores as ``1 + w`` in its conversions.
MLX_LM_SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                        "model.norm.weight", ".q_norm.weight", ".k_norm.weight")


@dataclass
class ModelArgs(qwen2_moe.ModelArgs):
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    full_attention_interval: int = 4
    partial_rotary_factor: float = 0.25
    norm_topk_prob: bool = True
    layer_types: Optional[List[str]] = None

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:
            n = self.full_attention_interval
            self.layer_types = ["full_attention" if (i + 1) % n == 0 else "linear_attention"
                                for i in range(self.num_hidden_layers)]

    def layer_windows(self):
        return [None] * self.num_hidden_layers


class GatedAttention(Attention):
    """The shared attention with a per-head output gate: ``q_proj`` yields each head's
    query then its gate, and the heads' output is scaled by ``sigmoid(gate)``."""

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, rope, norm, bias=False):
        super().__init__(hidden_size, n_heads, n_kv_heads, head_dim, rope, qk_norm=QKNorm(norm),
                         projections=Projections(bias=bias))
        self.q_proj = nn.Linear(hidden_size, 2 * n_heads * head_dim, bias=bias)


    def __call__(self, x, mask, offset, cache=None, attention=None):
        B, L, _ = x.shape
        q, gate = mx.split(self.q_proj(x).reshape(B, L, self.n_heads, 2 * self.head_dim), 2, -1)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1)
        q, k = self._qk_norm(q, k)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        q, k = self.rope(q, offset), self.rope(k, offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, self.scale, mask)
        out = out.transpose(0, 2, 1, 3).reshape(B, L, -1) * mx.sigmoid(gate.reshape(B, L, -1))
        return self.o_proj(out)


class Model(CausalLM):
    fused_projections = True  # Qwen3-Next's in_proj_qkvz/in_proj_ba (Qwen3.5: split)

    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps, zero_centered=True)
        rope = config_rope(args, int(args.head_dim * args.partial_rotary_factor))
        act = activation(args.hidden_act)

        def mlp(i):
            if not args.is_moe_layer(i):
                return MLP(args.hidden_size, args.intermediate_size, act)
            shared = MLP(args.hidden_size, args.shared_expert_intermediate_size, act)
            return SparseMoE(args.hidden_size, args.moe_intermediate_size, args.num_experts,
                             args.num_experts_per_tok, act, normalize=args.norm_topk_prob,
                             shared=SharedExpert(shared, gated=True))

        layers = []
        for i, kind in enumerate(args.layer_types):
            if kind == "linear_attention":
                heads = DeltaHeads(args.linear_num_key_heads, args.linear_num_value_heads,
                                   args.linear_key_head_dim, args.linear_value_head_dim)
                mixer = GatedDeltaNet(args.hidden_size, heads, args.linear_conv_kernel_dim,
                                      args.rms_norm_eps, fused=self.fused_projections)
                names = ("linear_attn", "mlp", "input_layernorm", "post_attention_layernorm")
            else:
                mixer = GatedAttention(args.hidden_size, args.num_attention_heads,
                                       args.num_key_value_heads, args.head_dim, rope, norm,
                                       bias=args.attention_bias)
                names = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
            layers.append(HybridBlock(mixer, mlp(i), norm, names))
        init_causal_lm(self, args, layers, norm())

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per linear-attention layer, a key/value cache per full one."""
        return [StateCache(2) if kind == "linear_attention"
                else KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size)
                for kind in self.args.layer_types]

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        k = self.args.linear_conv_kernel_dim
        if any(n.endswith("conv1d.weight") and w.ndim == 3 and w.shape[-1] == 1 and w.shape[1] == k
               for n, w in weights.items()):
            # Converted by mlx-lm (its ``(C, K, 1)`` convolutions): its norms hold
            # ``1 + w``, ours ``w``.
            for name in list(weights):
                if name.endswith(MLX_LM_SHIFTED_NORMS) and weights[name].ndim == 1:
                    weights[name] = weights[name] - 1.0
        for name in list(weights):
            if name.endswith("conv1d.weight"):
                weights[name] = CausalConv1d.sanitize_weight(weights[name], k)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts)
        return weights
