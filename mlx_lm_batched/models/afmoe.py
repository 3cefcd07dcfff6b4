"""AFMoE (Arcee Trinity): sandwich-normed blocks (norms before and after attention
and MLP); attention with per-head QK-norm and an output gate (``gate_proj``), RoPE
on the sliding-window layers only (the global ones use no positional encoding);
``num_dense_layers`` dense MLPs, then MoE blocks: a sigmoid (or softmax) router whose
choice is biased by ``expert_bias``, top-k renormalised and scaled by
``route_scale``, plus shared experts. ``mup_enabled`` scales the embeddings by
``sqrt(hidden_size)``."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import OutputGatedAttention
from ..layers.attention_options import QKNorm
from ..layers.blocks import SandwichBlock
from ..layers.mlp import MLP
from ..layers.moe import SwitchGLU, combine_experts, stack_experts, topk_indices
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm, type_windows
from .deepseek_v2 import limit_to_groups

NORM_NAMES = ("input_layernorm", "post_attention_layernorm", "pre_mlp_layernorm",
              "post_mlp_layernorm")


@dataclass
class ModelArgs(DecoderArgs):
    vocab_size: int = 200192
    head_dim: Optional[int] = 128
    moe_intermediate_size: int = 1408
    num_dense_layers: int = 1
    num_experts: int = 64
    num_experts_per_tok: int = 6
    num_shared_experts: int = 2
    route_scale: float = 1.0
    # mlx-lm's extra routing options (released configs carry them); transformers
    # implements their defaults.
    route_norm: bool = True
    score_func: str = "sigmoid"
    n_group: int = 1
    topk_group: int = 1
    global_attn_every_n_layers: int = 4
    sliding_window: Optional[int] = 1024
    layer_types: Optional[List[str]] = None
    mup_enabled: bool = False
    rms_norm_eps: float = 1e-5
    max_position_embeddings: Optional[int] = 16384

    def __post_init__(self):
        super().__post_init__()
        if self.score_func not in ("sigmoid", "softmax"):
            raise ValueError(f"afmoe: unknown score_func '{self.score_func}'")
        if self.layer_types is None:
            n = self.global_attn_every_n_layers
            self.layer_types = ["sliding_attention" if (i + 1) % n else "full_attention"
                                for i in range(self.num_hidden_layers)]


class Router(nn.Module):
    """The router's projection, under the checkpoint's ``router.gate`` name."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate = nn.Linear(args.hidden_size, args.num_experts, bias=False)


class AfmoeMoE(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.router = Router(args)
        self.expert_bias = mx.zeros((args.num_experts,))
        self.switch_mlp = SwitchGLU(args.hidden_size, args.moe_intermediate_size,
                                    args.num_experts)
        if args.num_shared_experts:
            self.shared_experts = MLP(args.hidden_size,
                                      args.moe_intermediate_size * args.num_shared_experts)

    def __call__(self, x):
        a = self.args
        logits = self.router.gate(x).astype(mx.float32)
        scores = (mx.sigmoid(logits) if a.score_func == "sigmoid"
                  else mx.softmax(logits, axis=-1, precise=True))
        choice = limit_to_groups(scores + self.expert_bias.astype(mx.float32), a.n_group,
                                 a.topk_group, lambda g: mx.topk(g, 2, axis=-1).sum(axis=-1),
                                 0.0)
        indices = topk_indices(choice, a.num_experts_per_tok)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        if a.route_norm and a.num_experts_per_tok > 1:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
        y = combine_experts(self.switch_mlp(x, indices), weights * a.route_scale, x.dtype)
        if "shared_experts" in self:
            y = y + self.shared_experts(x)
        return y


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        windows = type_windows(args.layer_types, args.sliding_window)
        layers = [
            SandwichBlock(
                OutputGatedAttention(args.hidden_size, args.num_attention_heads,
                                     args.num_key_value_heads, args.head_dim, rope if w else None,
                                     qk_norm=QKNorm(norm)),
                AfmoeMoE(args) if i >= args.num_dense_layers else
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
                norm_names=NORM_NAMES,
            )
            for i, w in enumerate(windows)
        ]
        init_causal_lm(self, args, layers, norm(), windows,
                       embed_scale=args.hidden_size**0.5 if args.mup_enabled else None)

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        for i in range(self.args.num_dense_layers, self.args.num_hidden_layers):
            prefix = f"model.layers.{i}.mlp"
            stack_experts(weights, prefix, self.args.num_experts)
            # mlx-lm's conversions name the stacked experts ``experts``.
            for name in ("gate_proj", "up_proj", "down_proj"):
                for param in ("weight", "scales", "biases"):
                    key = f"{prefix}.experts.{name}.{param}"
                    if key in weights:
                        weights[f"{prefix}.switch_mlp.{name}.{param}"] = weights.pop(key)
        return weights
