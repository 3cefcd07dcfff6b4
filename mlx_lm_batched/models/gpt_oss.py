"""GPT-OSS: alternating sliding-window / full attention layers with biased projections
and learned per-head attention sinks, YaRN RoPE, and an MoE whose router (with bias)
softmaxes its top-k logits over biased experts with a clamped SwiGLU
``(clip(up) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, limit)``.

Checkpoints store the experts fused and transposed (``gate_up_proj`` ``(E, H, 2I)``
with gate and up interleaved column by column); the original release stores them
as MXFP4 ``*_blocks`` / ``*_scales`` ``(E, out, ...)``. ``sanitize`` maps both to
``experts.{gate,up,down}_proj``.
"""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, Scores
from ..layers.blocks import PreNormBlock
from ..layers.moe import SwitchGLU, combine_experts, softmax_topk
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm, type_windows


@dataclass
class ModelArgs(DecoderArgs):
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    head_dim: int = 64
    sliding_window: int = 128
    layer_types: Optional[List[str]] = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attention_bias: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:
            self.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention"
                                for i in range(self.num_hidden_layers)]


class ClampedSwiGLU:
    def __init__(self, alpha, limit):
        self.alpha, self.limit = alpha, limit

    def __call__(self, gate, up):
        gate = mx.minimum(gate, self.limit)
        up = mx.clip(up, -self.limit, self.limit)
        return (up + 1) * (gate * mx.sigmoid(self.alpha * gate))


class GptOssMoE(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.router = nn.Linear(args.hidden_size, args.num_local_experts, bias=True)
        self.experts = SwitchGLU(args.hidden_size, args.intermediate_size, args.num_local_experts,
                                 bias=True, glu=ClampedSwiGLU(args.swiglu_alpha, args.swiglu_limit))
        self.top_k = args.num_experts_per_tok

    def __call__(self, x):
        # A softmax over the top-k logits == the top-k softmax probabilities renormalised.
        indices, weights = softmax_topk(self.router(x), self.top_k, normalize=True)
        return combine_experts(self.experts(x, indices), weights, x.dtype)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, projections=Projections(bias=args.attention_bias),
                          scores=Scores(sinks=True)),
                GptOssMoE(args),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(),
                       type_windows(args.layer_types, args.sliding_window))

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        out = {}
        for k, v in weights.items():
            if ".mlp.experts." not in k:
                out[k] = v
                continue
            prefix, name = k.split(".mlp.experts.")
            prefix += ".mlp.experts."
            if name == "gate_up_proj":  # (E, H, 2I), x @ W, gate/up interleaved columns
                out[prefix + "gate_proj.weight"] = v[..., ::2].swapaxes(1, 2)
                out[prefix + "up_proj.weight"] = v[..., 1::2].swapaxes(1, 2)
            elif name == "gate_up_proj_bias":
                out[prefix + "gate_proj.bias"] = v[..., ::2]
                out[prefix + "up_proj.bias"] = v[..., 1::2]
            elif name == "down_proj":  # (E, I, H)
                out[prefix + "down_proj.weight"] = v.swapaxes(1, 2)
            elif name == "down_proj_bias":
                out[prefix + "down_proj.bias"] = v
            elif name in ("gate_up_proj_blocks", "gate_up_proj_scales"):
                # MXFP4, (E, 2I, ...) with gate/up interleaved rows.
                param = "weight" if name.endswith("blocks") else "scales"
                if param == "weight":  # (E, out, in/32, 16) bytes -> (E, out, in/8) uint32
                    v = v.reshape(*v.shape[:2], -1).view(mx.uint32)
                out[prefix + f"gate_proj.{param}"] = v[:, ::2]
                out[prefix + f"up_proj.{param}"] = v[:, 1::2]
            elif name in ("down_proj_blocks", "down_proj_scales"):
                if name.endswith("blocks"):
                    out[prefix + "down_proj.weight"] = v.reshape(*v.shape[:2], -1).view(mx.uint32)
                else:
                    out[prefix + "down_proj.scales"] = v
            else:
                out[k] = v
        return out
