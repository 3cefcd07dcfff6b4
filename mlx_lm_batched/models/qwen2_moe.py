"""Qwen 2 MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen 2 attention (biased q/k/v), and a
softmax top-k MoE plus a shared expert scaled by a sigmoid gate. Layers listed in
``mlp_only_layers`` or off the ``decoder_sparse_step`` grid keep a dense MLP."""

from dataclasses import dataclass, field
from typing import List, Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP, activation
from ..layers.moe import SharedExpert, SparseMoE, stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm, type_windows


@dataclass
class ModelArgs(DecoderArgs):
    num_experts: Optional[int] = None
    num_local_experts: Optional[int] = None  # transformers 5's name for num_experts
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 1408
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: List[int] = field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    attention_bias: bool = False  # Qwen 3 MoE's bias flag (all four projections)
    use_sliding_window: bool = False
    sliding_window: Optional[int] = None
    max_window_layers: int = 0
    layer_types: Optional[List[str]] = None

    def __post_init__(self):
        super().__post_init__()
        self.num_experts = self.num_experts or self.num_local_experts

    def is_moe_layer(self, i):
        return (i not in (self.mlp_only_layers or []) and self.num_experts
                and (i + 1) % self.decoder_sparse_step == 0)

    def layer_windows(self):
        if not (self.use_sliding_window and self.sliding_window):
            return [None] * self.num_hidden_layers
        types = self.layer_types or [
            "sliding_attention" if (i + 1) % 2 and i < self.max_window_layers else "full_attention"
            for i in range(self.num_hidden_layers)
        ]
        return type_windows(types, self.sliding_window)


class Model(CausalLM):
    def __init__(self, args: ModelArgs, attention_kwargs=None, shared_expert=True,
                 layer_ropes=None):
        """``attention_kwargs``/``shared_expert``: what Qwen 3 MoE changes;
        ``layer_ropes``: one RoPE per layer (Mellum's per-layer-type theta)."""
        super().__init__()
        rope = config_rope(args, args.head_dim)
        layer_ropes = layer_ropes or [rope] * args.num_hidden_layers
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        attention_kwargs = attention_kwargs or dict(
            projections=Projections(bias=True, o_bias=False))
        act = activation(args.hidden_act)

        def mlp(i):
            if not args.is_moe_layer(i):
                return MLP(args.hidden_size, args.intermediate_size, act)
            shared = None
            if shared_expert and args.shared_expert_intermediate_size:
                shared = SharedExpert(
                    MLP(args.hidden_size, args.shared_expert_intermediate_size, act), gated=True)
            return SparseMoE(args.hidden_size, args.moe_intermediate_size, args.num_experts,
                             args.num_experts_per_tok, act, normalize=args.norm_topk_prob,
                             shared=shared)

        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, layer_ropes[i], **attention_kwargs),
                mlp(i),
                norm,
            )
            for i in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), args.layer_windows())

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts)
        return weights
