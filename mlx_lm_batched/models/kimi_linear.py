"""Kimi Linear: Kimi delta attention layers (per-channel forget gate, ``StateCache``)
mixed with RoPE-free multi-head latent attention (``KVCache``), DeepSeek-V3-style
sigmoid-routed MoE with shared experts after the first dense layers."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers.gated_delta import KimiDeltaAttention
from ..layers.mla import LatentDims, MultiHeadLatentAttention
from ..layers.mlp import MLP
from ..layers.moe import SwitchGLU, combine_experts, stack_experts
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d, HybridBlock
from ..layers.stack import CausalLM
from .common import DecoderArgs, init_causal_lm
from .deepseek_v3 import SigmoidGate


@dataclass
class ModelArgs(DecoderArgs):
    """Kimi Linear's config (Hugging Face ``KimiLinearConfig`` names and defaults). The
    latent attention has no RoPE: ``DecoderArgs``'s RoPE fields go unused."""

    layer_types: Optional[List[str]] = None
    mlp_layer_types: Optional[List[str]] = None
    linear_attn_config: Optional[dict] = None  # the hub checkpoints' layout
    first_k_dense_replace: int = 1
    moe_intermediate_size: int = 1024
    num_experts: int = 256
    num_experts_per_token: int = 8
    num_shared_experts: int = 1
    moe_renormalize: bool = True
    num_expert_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 2.446
    kv_lora_rank: int = 512
    q_lora_rank: Optional[int] = None
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    linear_head_dim: int = 128
    linear_num_heads: int = 32
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-5

    def __post_init__(self):
        super().__post_init__()
        lac = self.linear_attn_config or {}
        self.linear_head_dim = lac.get("head_dim", self.linear_head_dim)
        self.linear_num_heads = lac.get("num_heads", self.linear_num_heads)
        self.linear_conv_kernel_dim = lac.get("short_conv_kernel_size", self.linear_conv_kernel_dim)
        n = self.num_hidden_layers
        if self.layer_types is None:
            if "full_attn_layers" in lac and "kda_layers" in lac:  # 1-indexed layer lists
                full = {i - 1 for i in lac["full_attn_layers"]}
                self.layer_types = ["full_attention" if i in full else "linear_attention"
                                    for i in range(n)]
            else:
                self.layer_types = ["full_attention" if i and i % 4 == 0 else "linear_attention"
                                    for i in range(n)]
        if self.mlp_layer_types is None:
            self.mlp_layer_types = ["dense" if i < self.first_k_dense_replace else "sparse"
                                    for i in range(n)]
        # the names DeepSeek V3's router reads
        self.n_routed_experts, self.num_experts_per_tok = self.num_experts, self.num_experts_per_token
        self.n_group, self.norm_topk_prob = self.num_expert_group, self.moe_renormalize


class KimiMoE(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.gate = SigmoidGate(args)
        self.switch_mlp = SwitchGLU(args.hidden_size, args.moe_intermediate_size, args.num_experts)
        self.shared_experts = MLP(args.hidden_size,
                                  args.moe_intermediate_size * args.num_shared_experts)

    def __call__(self, x):
        indices, weights = self.gate(x)
        y = combine_experts(self.switch_mlp(x, indices), weights, x.dtype)
        return y + self.shared_experts(x)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = []
        for kind, mlp_kind in zip(args.layer_types, args.mlp_layer_types):
            if kind == "linear_attention":
                mixer = KimiDeltaAttention(args.hidden_size, args.linear_num_heads,
                                           args.linear_head_dim, args.linear_conv_kernel_dim,
                                           args.rms_norm_eps)
            else:
                mixer = MultiHeadLatentAttention(
                    args.hidden_size, args.num_attention_heads, LatentDims.from_args(args))
            mlp = KimiMoE(args) if mlp_kind == "sparse" else MLP(args.hidden_size,
                                                                  args.intermediate_size)
            layers.append(HybridBlock(mixer, mlp, norm))
        init_causal_lm(self, args, layers, norm())

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per KDA layer, a key/value cache per latent-attention one."""
        return [StateCache(2) if kind == "linear_attention"
                else KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size)
                for kind in self.args.layer_types]

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        renamed = {}
        for k, v in weights.items():
            k = k.replace(".block_sparse_moe.", ".mlp.")
            for name in ("A_log", "dt_bias", "f_a_proj.", "f_b_proj."):
                k = k.replace(f"self_attn.{name}", f"self_attn.forget_gate.{name}")
            renamed[k] = v
        weights = renamed
        for i, kind in enumerate(self.args.layer_types):
            prefix = f"model.layers.{i}.self_attn."
            if kind == "linear_attention" and prefix + "q_conv1d.weight" in weights:
                # Moonshot's checkpoints keep one depthwise conv each for q, k and v.
                weights[prefix + "conv1d.weight"] = mx.concatenate(
                    [weights.pop(prefix + f"{n}_conv1d.weight") for n in "qkv"], axis=0)
        for name in list(weights):
            if name.endswith("conv1d.weight"):
                weights[name] = CausalConv1d.sanitize_weight(weights[name],
                                                             self.args.linear_conv_kernel_dim)
        for i, kind in enumerate(self.args.mlp_layer_types):
            if kind == "sparse":
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts,
                              names={"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"})
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts)
        return weights
