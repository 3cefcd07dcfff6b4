"""MiMo-V2-Flash (Xiaomi): pre-norm blocks mixing full-attention layers and
sliding-window layers (twice the key/value heads, per-head attention sinks), each
type with its own RoPE (theta, partial rotation); value heads narrower than the
query/key heads and scaled by ``attention_value_scale``; ``mlp_layer_types`` dense
or DeepSeek-V3 MoE (sigmoid router with a choice bias, group-limited top-k, no
shared experts). Reads transformers' config and the hub's own layout
(``hybrid_layer_pattern``, ``swa_*`` keys, ``sliding_window_size``)."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Scores
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.moe import stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from . import glm4_moe
from .common import init_causal_lm, layer_type_rope, type_windows
from .deepseek_v2 import DeepseekMoE
from .deepseek_v3 import SigmoidGate


@dataclass
class ModelArgs(glm4_moe.ModelArgs):
    vocab_size: int = 152576
    num_key_value_heads: Optional[int] = 4
    head_dim: Optional[int] = 192
    v_head_dim: int = 128
    n_routed_experts: int = 256
    n_shared_experts: Optional[int] = None
    routed_scaling_factor: Optional[float] = 1.0
    rms_norm_eps: float = 1e-6
    sliding_window: Optional[int] = 129
    mlp_layer_types: Optional[List[str]] = None
    attention_value_scale: Optional[float] = 0.707
    partial_rotary_factor: Optional[float] = None
    rope_parameters_by_type: Optional[dict] = None
    rope_local_base_freq: Optional[float] = None
    swa_num_key_value_heads: Optional[int] = None
    add_swa_attention_sink_bias: bool = True
    add_full_attention_sink_bias: bool = False

    @classmethod
    def from_dict(cls, params):
        params = dict(params)
        # The hub's own layout (what mlx-lm reads).
        if "hybrid_layer_pattern" in params and "layer_types" not in params:
            params["layer_types"] = ["sliding_attention" if p else "full_attention"
                                     for p in params["hybrid_layer_pattern"]]
        if isinstance(params.get("moe_layer_freq"), list) and "mlp_layer_types" not in params:
            params["mlp_layer_types"] = ["sparse" if f else "dense"
                                         for f in params["moe_layer_freq"]]
        if "layernorm_epsilon" in params:
            params.setdefault("rms_norm_eps", params["layernorm_epsilon"])
        if "swa_rope_theta" in params:
            params.setdefault("rope_local_base_freq", params["swa_rope_theta"])
        if params.get("sliding_window_size") is not None:
            # The reference (SGLang) attends to sliding_window_size previous tokens
            # plus the query, as transformers does.
            params["sliding_window"] = params["sliding_window_size"] + 1
        return super().from_dict(params)

    def __post_init__(self):
        super().__post_init__()
        n = self.num_hidden_layers
        if self.routed_scaling_factor is None:  # hub configs store null
            self.routed_scaling_factor = 1.0
        if self.layer_types is None:
            self.layer_types = ["full_attention" if i == 0 or (i + 1) % 6 == 0
                                else "sliding_attention" for i in range(n)]
        if self.mlp_layer_types is None:
            self.mlp_layer_types = ["dense"] + ["sparse"] * (n - 1)
        if self.swa_num_key_value_heads is None:
            self.swa_num_key_value_heads = 2 * self.num_key_value_heads
        if self.rope_parameters_by_type is None and self.rope_local_base_freq is None:
            # transformers' defaults (the released checkpoint's thetas).
            self.rope_parameters_by_type = {
                t: {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.334}
                for t, theta in (("full_attention", 5e6), ("sliding_attention", 1e4))}

    def is_moe_layer(self, i):
        return self.mlp_layer_types[i] == "sparse"


class ValueHeadAttention(Attention):
    """The shared attention with value heads of their own width (``v_head_dim``),
    scaled by ``value_scale``: ``softmax(qk) (s v) = s softmax(qk) v``, so the
    scale is applied to the heads' output."""

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, v_head_dim, rope,
                 value_scale=1.0, **kwargs):
        super().__init__(hidden_size, n_heads, n_kv_heads, head_dim, rope, **kwargs)
        self.v_head_dim = v_head_dim
        self.v_proj = nn.Linear(hidden_size, n_kv_heads * v_head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, hidden_size, bias=False)
        self.value_scale = value_scale

    def __call__(self, x, mask, offset, cache=None, attention=None):
        return super().__call__(x, mask, offset, cache, attention, output_gate=self.value_scale)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        ropes = {t: layer_type_rope(args, t, 0.334) for t in set(args.layer_types)}
        layers = []
        for i, t in enumerate(args.layer_types):
            sliding = t == "sliding_attention"
            sinks = (args.add_swa_attention_sink_bias if sliding
                     else args.add_full_attention_sink_bias)
            attn = ValueHeadAttention(
                args.hidden_size, args.num_attention_heads,
                args.swa_num_key_value_heads if sliding else args.num_key_value_heads,
                args.head_dim, args.v_head_dim, ropes[t],
                value_scale=args.attention_value_scale or 1.0, scores=Scores(sinks=sinks))
            mlp = (DeepseekMoE(args, SigmoidGate(args)) if args.is_moe_layer(i)
                   else MLP(args.hidden_size, args.intermediate_size, args.hidden_act))
            layers.append(PreNormBlock(attn, mlp, norm))
        init_causal_lm(self, args, layers, norm(),
                       type_windows(args.layer_types, args.sliding_window))

    def sanitize(self, weights):
        weights = {k: v for k, v in weights.items() if not k.startswith("model.mtp.")}
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.n_routed_experts)
        for k in [k for k in weights if k.endswith(".attention_sink_bias")]:
            weights[k.replace(".attention_sink_bias", ".sinks")] = weights.pop(k)
        return weights
