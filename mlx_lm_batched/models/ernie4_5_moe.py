"""ERNIE 4.5 MoE: llama blocks with interleaved RoPE, one bias flag for every linear
layer, and MoE layers (from ``moe_layer_start_index`` to ``moe_layer_end_index`` every
``moe_layer_interval``) with a float32 softmax router whose choice (not weights) is
shifted by ``moe_statics.e_score_correction_bias``, plus always-on shared experts."""

from dataclasses import dataclass, field
from typing import List

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP, activation
from ..layers.moe import SharedExpert, SparseMoE, softmax_topk, stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    moe_num_experts: int = 64
    moe_k: int = 6
    moe_intermediate_size: int = 1536
    moe_num_shared_experts: int = 0
    moe_layer_start_index: int = 1
    moe_layer_end_index: int = -1
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_bias: bool = False
    tie_word_embeddings: bool = True
    # mlx-lm's fields: expert capacities apply in training only; the router always
    # shifts its choice by ``e_score_correction_bias`` (zeros when the checkpoint has
    # none, i.e. without aux-free balancing), so ``moe_use_aux_free`` needs no switch.
    moe_capacity: List[int] = field(default_factory=list)
    moe_use_aux_free: bool = False
    moe_gate_act: str = "softmax"

    def __post_init__(self):
        super().__post_init__()
        require_values(self, moe_gate_act=("softmax",))
        if self.moe_layer_end_index in (None, -1):
            self.moe_layer_end_index = self.num_hidden_layers - 1

    def is_moe_layer(self, i):
        return (self.moe_num_experts and (i + 1) % self.moe_layer_interval == 0
                and self.moe_layer_start_index <= i <= self.moe_layer_end_index)


class ErnieMoE(SparseMoE):
    def __init__(self, args: ModelArgs):
        act = activation(args.hidden_act)
        shared = None
        if args.moe_num_shared_experts:
            shared = SharedExpert(MLP(args.hidden_size,
                                      args.moe_intermediate_size * args.moe_num_shared_experts,
                                      act, args.use_bias), "shared_experts")
        super().__init__(args.hidden_size, args.moe_intermediate_size, args.moe_num_experts,
                         args.moe_k, act, normalize=True, shared=shared)
        self.moe_statics = nn.Module()
        self.moe_statics.e_score_correction_bias = mx.zeros((1, args.moe_num_experts))
        self.norm_min = args.moe_norm_min

    def route(self, x):
        logits = self.gate(x.astype(mx.float32))  # transformers keeps the router in float32
        return softmax_topk(logits, self.top_k, normalize=True, norm_min=self.norm_min,
                            choice_bias=self.moe_statics.e_score_correction_bias[0])


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim, traditional=True)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, projections=Projections(bias=args.use_bias)),
                ErnieMoE(args) if args.is_moe_layer(i) else
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.use_bias),
                norm,
            )
            for i in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), head_bias=args.use_bias)

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        if "lm_head" in self and "lm_head.weight" not in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        # Multi-token-prediction heads (mtp_block, mtp_emb_norm, ...) are not used here.
        weights = {k: v for k, v in weights.items() if ".mtp_" not in k and not k.startswith("mtp_")}
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer(i):
                prefix = f"model.layers.{i}.mlp"
                stack_experts(weights, prefix, self.args.moe_num_experts)
                # mlx-lm's conversions drop the bias (routing as if it were zero).
                weights.setdefault(f"{prefix}.moe_statics.e_score_correction_bias",
                                   mx.zeros((1, self.args.moe_num_experts)))
        return weights
