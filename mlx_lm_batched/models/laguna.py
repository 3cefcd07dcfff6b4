"""Laguna (poolside): pre-norm blocks; attention with per-head QK-norm, a per-layer
head count, RoPE per layer type (its own theta, partial rotation and scaling for full
and sliding-window layers) and a softplus output gate (``g_proj``, one per head or per
feature); ``mlp_layer_types`` dense or MoE (sigmoid router, optionally soft-capped,
choice biased by ``e_score_correction_bias``, top-k renormalised; the routed sum times
``moe_routed_scaling_factor``, plus a shared expert)."""

from dataclasses import dataclass
from typing import List, Optional, Union

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import OutputGatedAttention
from ..layers.attention_options import OutputGate, Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.moe import SwitchGLU, combine_experts, stack_experts, topk_indices
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, init_causal_lm, layer_type_rope, type_windows


@dataclass
class ModelArgs(DecoderArgs):
    vocab_size: int = 100352
    num_key_value_heads: Optional[int] = 8
    head_dim: Optional[int] = 128
    max_position_embeddings: Optional[int] = 131072
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    # mlx-lm's split of the biases: q/k/v by ``qkv_bias``, o by ``attention_bias``;
    # None (transformers' configs) means ``attention_bias`` for all four.
    qkv_bias: Optional[bool] = None
    moe_router_score_func: str = "sigmoid"
    gating: Union[bool, str] = True
    num_attention_heads_per_layer: Optional[List[int]] = None
    layer_types: Optional[List[str]] = None
    mlp_layer_types: Optional[List[str]] = None
    sliding_window: Optional[int] = 512
    partial_rotary_factor: Optional[float] = None
    rope_parameters_by_type: Optional[dict] = None
    rope_local_base_freq: Optional[float] = None
    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    moe_routed_scaling_factor: float = 1.0
    moe_router_logit_softcapping: float = 0.0
    moe_apply_router_weight_on_input: bool = False

    def __post_init__(self):
        super().__post_init__()
        require_values(self, moe_router_score_func=("sigmoid",))
        if self.qkv_bias is None:
            self.qkv_bias = self.attention_bias
        n = self.num_hidden_layers
        if self.moe_apply_router_weight_on_input:
            raise NotImplementedError("laguna: moe_apply_router_weight_on_input=True is not "
                                      "supported (neither is it by transformers)")
        if self.gating not in (True, "per-head", "per-element"):
            raise ValueError(f"laguna: unknown gating {self.gating!r}")
        self.layer_types = self.layer_types or ["full_attention"] * n
        self.mlp_layer_types = self.mlp_layer_types or ["dense"] + ["sparse"] * (n - 1)
        self.num_attention_heads_per_layer = (self.num_attention_heads_per_layer
                                              or [self.num_attention_heads] * n)


class LagunaGate(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.weight = mx.zeros((args.num_experts, args.hidden_size))
        self.e_score_correction_bias = mx.zeros((args.num_experts,))
        self.top_k = args.num_experts_per_tok
        self.softcap = args.moe_router_logit_softcapping

    def __call__(self, x):
        logits = x.astype(mx.float32) @ self.weight.astype(mx.float32).T
        if self.softcap > 0:
            logits = mx.tanh(logits / self.softcap) * self.softcap
        scores = mx.sigmoid(logits)
        indices = topk_indices(scores + self.e_score_correction_bias.astype(mx.float32),
                               self.top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        return indices, weights / weights.sum(axis=-1, keepdims=True)


class LagunaMoE(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate = LagunaGate(args)
        self.switch_mlp = SwitchGLU(args.hidden_size, args.moe_intermediate_size,
                                    args.num_experts)
        self.shared_expert = MLP(args.hidden_size, args.shared_expert_intermediate_size)
        self.scaling = args.moe_routed_scaling_factor

    def __call__(self, x):
        indices, weights = self.gate(x)
        routed = combine_experts(self.switch_mlp(x, indices), weights, x.dtype)
        return routed * self.scaling + self.shared_expert(x)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        ropes = {t: layer_type_rope(args, t) for t in set(args.layer_types)}
        per_head = args.gating is True or args.gating == "per-head"
        layers = [
            PreNormBlock(
                OutputGatedAttention(args.hidden_size, heads, args.num_key_value_heads,
                                     args.head_dim, ropes[t],
                                     OutputGate("softplus", per_head=per_head, name="g_proj"),
                                     qk_norm=QKNorm(norm),
                                     projections=Projections(bias=args.qkv_bias,
                                                             o_bias=args.attention_bias)),
                LagunaMoE(args) if m == "sparse" else
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for t, m, heads in zip(args.layer_types, args.mlp_layer_types,
                                   args.num_attention_heads_per_layer)
        ]
        init_causal_lm(self, args, layers, norm(),
                       type_windows(args.layer_types, args.sliding_window))

    def sanitize(self, weights):
        # Public repacks (mlx-lm's test names Laguna-XS-2.1-bf16) wrap every tensor in a
        # VLM-style ``language_model.`` prefix; the model is text only.
        weights = {k.removeprefix("language_model."): v for k, v in weights.items()}
        weights = super().sanitize(weights)
        for i, kind in enumerate(self.args.mlp_layer_types):
            if kind == "sparse":
                prefix = f"model.layers.{i}.mlp"
                # Checkpoints keep the router bias with the experts; transformers'
                # in-memory names say shared_experts.
                bias = weights.pop(f"{prefix}.experts.e_score_correction_bias", None)
                if bias is not None:
                    weights[f"{prefix}.gate.e_score_correction_bias"] = bias
                for k in [k for k in weights if k.startswith(f"{prefix}.shared_experts.")]:
                    weights[k.replace(".shared_experts.", ".shared_expert.")] = weights.pop(k)
                stack_experts(weights, prefix, self.args.num_experts)
                # mlx-lm's conversions name the stacked experts ``experts``.
                for name in ("gate_proj", "up_proj", "down_proj"):
                    for param in ("weight", "scales", "biases"):
                        key = f"{prefix}.experts.{name}.{param}"
                        if key in weights:
                            weights[f"{prefix}.switch_mlp.{name}.{param}"] = weights.pop(key)
        return weights
