"""EXAONE MoE (K-EXAONE): EXAONE 4's attention (per-head QK-norm; RoPE only on the
sliding-window layers when a window is configured) in pre-norm blocks whose MLPs are,
per ``mlp_layer_types``, dense or DeepSeek-V3 MoE (sigmoid router with a choice bias,
group-limited top-k, shared experts). Multi-token-prediction weights are dropped."""

from dataclasses import dataclass
from typing import List, Optional, Union

from ..layers.attention import Attention
from ..layers.attention_options import QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.moe import stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from . import exaone4, glm4_moe
from .common import config_rope, init_causal_lm, type_windows
from .deepseek_v2 import DeepseekMoE
from .deepseek_v3 import SigmoidGate


@dataclass
class ModelArgs(glm4_moe.ModelArgs):
    num_experts: int = 64
    num_shared_experts: int = 1
    moe_intermediate_size: int = 1024
    routed_scaling_factor: float = 2.5
    partial_rotary_factor: float = 1.0
    sliding_window: Optional[int] = 4096
    sliding_window_pattern: Optional[Union[int, str]] = 4
    mlp_layer_types: Optional[List[str]] = None
    # mlx-lm's name (its converted configs hold it): per layer, True for MoE. Read when
    # ``mlp_layer_types`` is absent; afterwards both say the same.
    is_moe_layer: Optional[List[bool]] = None

    def __post_init__(self):
        super().__post_init__()
        # The shared DeepSeek MoE block reads DeepSeek's names.
        self.n_routed_experts = self.num_experts
        self.n_shared_experts = self.num_shared_experts
        if self.layer_types is None:
            self.layer_types = exaone4.ModelArgs.from_dict(dict(
                model_type="exaone4", hidden_size=self.hidden_size,
                num_hidden_layers=self.num_hidden_layers,
                intermediate_size=self.intermediate_size,
                num_attention_heads=self.num_attention_heads, vocab_size=self.vocab_size,
                sliding_window=self.sliding_window,
                sliding_window_pattern=self.sliding_window_pattern)).layer_types
        if self.mlp_layer_types is None and self.is_moe_layer is not None:
            self.mlp_layer_types = ["sparse" if moe else "dense" for moe in self.is_moe_layer]
        if self.mlp_layer_types is None:
            self.mlp_layer_types = ["dense" if i < self.first_k_dense_replace else "sparse"
                                    for i in range(self.num_hidden_layers)]
        self.is_moe_layer = [t == "sparse" for t in self.mlp_layer_types]

    def layer_windows(self):
        return type_windows(self.layer_types, self.sliding_window)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        windows = args.layer_windows()
        layers = [
            PreNormBlock(
                # transformers: RoPE on every layer only when no window is configured.
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope if args.sliding_window is None or w else None,
                          qk_norm=QKNorm(norm)),
                DeepseekMoE(args, SigmoidGate(args)) if args.is_moe_layer[i] else
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for i, w in enumerate(windows)
        ]
        init_causal_lm(self, args, layers, norm(), windows)

    def sanitize(self, weights):
        weights = {k: v for k, v in weights.items() if not k.startswith("mtp.")}
        for k in [k for k in weights if k.endswith(".mlp.e_score_correction_bias")]:
            # mlx-lm's conversions keep the bias beside the router, not in it.
            weights[k.replace(".mlp.", ".mlp.gate.")] = weights.pop(k)
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer[i]:
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.n_routed_experts)
        return weights
