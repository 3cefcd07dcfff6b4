"""Klear (Kuaishou): Qwen 3 style attention (per-head QK-norm) and a MoE block whose
routed experts (sigmoid router; an ``expert_bias`` shifts the choice, not the
weights) and always-on shared experts are mixed by a learned two-way softmax
(``coefficient``). Layers in ``mlp_only_layers`` or off the ``decoder_sparse_step``
grid keep a dense MLP; the head is never tied."""

import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.moe import SharedExpert, SparseMoE, combine_experts, softmax_topk, stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from . import qwen2_moe
from .common import config_rope, init_causal_lm


@dataclass
class ModelArgs(qwen2_moe.ModelArgs):
    n_shared_experts: int = 1
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False


class KlearMoE(SparseMoE):
    """Routed experts ``switch_mlp`` and shared ``shared_experts``, weighted per
    token by ``softmax(coefficient(x))``."""

    def __init__(self, args: ModelArgs):
        shared = MLP(args.hidden_size, args.moe_intermediate_size * args.n_shared_experts)
        super().__init__(args.hidden_size, args.moe_intermediate_size, args.num_experts,
                         args.num_experts_per_tok, normalize=args.norm_topk_prob,
                         shared=SharedExpert(shared, "shared_experts"))
        self.coefficient = nn.Linear(args.hidden_size, 2)
        self.expert_bias = mx.zeros((args.num_experts,))

    def route(self, x):
        return softmax_topk(self.gate(x), self.top_k, self.normalize,
                            choice_bias=self.expert_bias, sigmoid=True)

    def __call__(self, x):
        indices, weights = self.route(x)
        routed = combine_experts(self.switch_mlp(x, indices), weights, x.dtype)
        coef = mx.softmax(self.coefficient(x).astype(mx.float32), axis=-1,
                          precise=True).astype(x.dtype)
        return routed * coef[..., :1] + self.shared_experts(x) * coef[..., 1:]


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, qk_norm=QKNorm(norm),
                          projections=Projections(bias=args.attention_bias)),
                KlearMoE(args) if args.is_moe_layer(i) else
                MLP(args.hidden_size, args.intermediate_size),
                norm,
            )
            for i in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        # mlx-lm's conversions keep the stacked experts under ``experts``.
        weights = {re.sub(r"\.mlp\.experts\.(gate_proj|up_proj|down_proj)\.",
                          r".mlp.switch_mlp.\1.", k): v for k, v in super().sanitize(weights).items()}
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts)
        return weights
