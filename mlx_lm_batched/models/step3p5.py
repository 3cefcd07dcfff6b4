"""Step 3.5 (StepFun): pre-norm blocks alternating sliding-window and full attention
(the sliding layers may have their own head counts, ``attention_other_setting``);
per-head QK-norm, a sigmoid output gate per head (``g_proj``), per-layer RoPE theta
and partial rotation (yarn only on ``yarn_only_types``); dense or MoE MLPs (sigmoid
router whose choice is biased by ``router_bias``, optionally renormalised, times
``moe_router_scaling_factor``, plus a shared expert), optionally with clamped SwiGLU
per layer. Hub checkpoints store the norms zero-centred (``1 + w``) and the experts
under ``moe.``: both are converted on load."""

from dataclasses import dataclass
from functools import partial
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import OutputGatedAttention
from ..layers.attention_options import OutputGate, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.moe import SwitchGLU, combine_experts, topk_indices
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm

# Hub names -> ours (mlx-lm's).
RENAMES = ((".moe.gate_proj.", ".mlp.switch_mlp.gate_proj."),
           (".moe.up_proj.", ".mlp.switch_mlp.up_proj."),
           (".moe.down_proj.", ".mlp.switch_mlp.down_proj."),
           (".moe.gate.", ".mlp.gate.gate."),
           (".moe.router_bias", ".mlp.gate.router_bias"),
           (".share_expert.", ".mlp.share_expert."))


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    num_attention_heads: int
    head_dim: int
    intermediate_size: int
    # Key/value heads: mlx-lm's and the hub's name, and transformers 5's (which saves only
    # ``num_key_value_heads``).
    num_attention_groups: Optional[int] = None
    num_key_value_heads: Optional[int] = None
    rms_norm_eps: float = 1e-5
    rope_theta: object = 10000.0  # one theta, or one per layer
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 262144
    sliding_window: int = 512
    layer_types: Optional[List[str]] = None
    yarn_only_types: Optional[List[str]] = None
    partial_rotary_factors: Optional[List[float]] = None
    attention_other_setting: Optional[dict] = None
    use_head_wise_attn_gate: bool = True
    moe_num_experts: int = 288
    moe_top_k: int = 8
    moe_intermediate_size: int = 1280
    share_expert_dim: int = 1280
    moe_layers_enum: Optional[str] = None
    moe_router_scaling_factor: float = 3.0
    norm_expert_weight: bool = True
    swiglu_limits: Optional[List[float]] = None
    swiglu_limits_shared: Optional[List[float]] = None
    tie_word_embeddings: bool = False

    def __post_init__(self):
        n = self.num_hidden_layers
        if self.num_attention_groups is None:
            if self.num_key_value_heads is None:
                raise ValueError("step3p5 config needs num_attention_groups (or "
                                 "num_key_value_heads)")
            self.num_attention_groups = self.num_key_value_heads
        if self.layer_types is None:
            self.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention"
                                for i in range(n)]
        if not self.use_head_wise_attn_gate:
            raise NotImplementedError("step3p5: use_head_wise_attn_gate=False is not supported")

    def moe_layers(self):
        if self.moe_layers_enum:
            return {int(i) for i in self.moe_layers_enum.strip().split(",")}
        return set(range(1, self.num_hidden_layers))

    def per_layer(self, values, i, default=0):
        return (values[i] or default) if values and i < len(values) else default


def clamped_glu(gate, up, limit):
    """SwiGLU with ``silu(gate)`` capped at ``limit`` and ``up`` clipped to +-limit (bound
    to a limit with ``functools.partial``, so the modules holding it copy and pickle)."""
    return mx.minimum(nn.silu(gate), limit) * mx.clip(up, -limit, limit)


class StepMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, limit):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.limit = limit

    def __call__(self, x):
        g, u = self.gate_proj(x), self.up_proj(x)
        h = clamped_glu(g, u, self.limit) if self.limit else nn.silu(g) * u
        return self.down_proj(h)


class StepGate(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate = nn.Linear(args.hidden_size, args.moe_num_experts, bias=False)
        self.router_bias = mx.zeros((args.moe_num_experts,))


class StepMoE(nn.Module):
    def __init__(self, args: ModelArgs, i):
        super().__init__()
        self.args = args
        limit = args.per_layer(args.swiglu_limits, i)
        self.gate = StepGate(args)
        self.switch_mlp = SwitchGLU(args.hidden_size, args.moe_intermediate_size,
                                    args.moe_num_experts,
                                    glu=partial(clamped_glu, limit=limit) if limit else None)
        self.share_expert = StepMLP(args.hidden_size, args.share_expert_dim,
                                    args.per_layer(args.swiglu_limits_shared, i))

    def __call__(self, x):
        a = self.args
        scores = mx.sigmoid(self.gate.gate(x).astype(mx.float32))
        indices = topk_indices(scores + self.gate.router_bias.astype(mx.float32), a.moe_top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        if a.norm_expert_weight:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
        weights = weights * a.moe_router_scaling_factor
        return combine_experts(self.switch_mlp(x, indices), weights, x.dtype) + \
            self.share_expert(x)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        moe = args.moe_layers()
        other = args.attention_other_setting or {}
        layers = []
        for i, t in enumerate(args.layer_types):
            sliding = t == "sliding_attention"
            heads = other.get("num_attention_heads", args.num_attention_heads) if sliding \
                else args.num_attention_heads
            kv = other.get("num_attention_groups", args.num_attention_groups) if sliding \
                else args.num_attention_groups
            theta = args.rope_theta[i] if isinstance(args.rope_theta, list) else args.rope_theta
            partial = args.per_layer(args.partial_rotary_factors, i, 1.0)
            yarn = not args.yarn_only_types or t in args.yarn_only_types
            rope = make_rope(int(args.head_dim * partial), theta, False,
                             args.rope_scaling if yarn else None, args.max_position_embeddings)
            attn = OutputGatedAttention(args.hidden_size, heads, kv, args.head_dim, rope,
                                        OutputGate(per_head=True, name="g_proj"),
                                        qk_norm=QKNorm(norm))
            mlp = (StepMoE(args, i) if i in moe else
                   StepMLP(args.hidden_size, args.intermediate_size,
                           args.per_layer(args.swiglu_limits_shared, i)))
            layers.append(PreNormBlock(attn, mlp, norm))
        init_causal_lm(self, args, layers, norm(),
                       [args.sliding_window if t == "sliding_attention" else None
                        for t in args.layer_types])

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        hub = any(src in k and dst not in k for k in weights for src, dst in RENAMES)
        out = {}
        for k, v in weights.items():
            if ".mtp" in k or (k.startswith("model.layers.")
                               and int(k.split(".")[2]) >= self.args.num_hidden_layers):
                continue
            for src, dst in RENAMES:
                if src in k and dst not in k:
                    k = k.replace(src, dst)
                    break
            if hub and k.endswith(".weight") and "norm" in k:
                v = v + 1  # the hub's zero-centred norms
            out[k] = v
        return out
