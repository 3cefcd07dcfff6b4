"""Bailing MoE (inclusionAI's Ling / Ring, 1.x and 2.0): llama blocks under Bailing's
names with one fused ``query_key_value`` projection, optional per-head QK-norm
(before RoPE), partial rotary, and MoE blocks after the first
``first_k_dense_replace`` dense layers: a softmax or sigmoid router, optionally
biased (``expert_bias``, choice only) and limited to the best groups of experts,
plus always-on shared experts. ``norm_head`` divides the head's columns by their
norms once, at load."""

import re
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP, activation
from ..layers.moe import SharedExpert, SparseMoE, SwitchGLU, stack_experts, topk_indices
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, config_rope, init_causal_lm
from .deepseek_v2 import limit_to_groups

RENAMES = [  # checkpoint name pattern -> ours
    (r"^model\.word_embeddings\.", "model.embed_tokens."),
    (r"\.attention\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.attention\.dense\.", ".self_attn.o_proj."),
    (r"\.attention\.", ".self_attn."),
    (r"\.mlp\.gate\.weight$", ".mlp.gate.gate_proj.weight"),  # Hugging Face's router
]
SCORE_FUNCTIONS = ("softmax", "sigmoid")


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    moe_intermediate_size: Optional[int] = None
    num_experts: Optional[int] = None
    num_experts_per_tok: int = 1
    num_shared_experts: int = 0
    moe_shared_expert_intermediate_size: Optional[int] = None
    moe_router_enable_shared_expert: bool = True
    first_k_dense_replace: int = 0
    norm_topk_prob: bool = True
    score_function: str = "softmax"
    moe_router_enable_expert_bias: bool = False
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 4
    router_dtype: Optional[str] = None  # "fp32": router logits from float32 weights
    use_bias: bool = False
    use_qkv_bias: bool = False
    use_qk_norm: bool = False
    norm_head: bool = False
    partial_rotary_factor: float = 1.0
    rotary_dim: Optional[int] = None
    # mlx-lm's fields for variants this implementation does not have (checked below).
    norm_softmax: bool = False
    moe_router_enable_routed_scaling: bool = True

    def __post_init__(self):
        super().__post_init__()
        require_values(self, norm_softmax=(False,), moe_router_enable_routed_scaling=(True,))
        if self.score_function not in SCORE_FUNCTIONS:
            raise ValueError(f"score_function '{self.score_function}' is not one of "
                             f"{', '.join(SCORE_FUNCTIONS)}")

    # Scores of the experts in dropped groups (Ling 2's reference code: 0; the hybrid and
    # V3 families: -inf, so a kept expert whose biased score is negative still ranks above).
    dropped_group_score = 0.0

    def renormalizes_choices(self):
        """Whether the chosen experts' weights are divided by their sum (one choice: no)."""
        return self.norm_topk_prob and self.num_experts_per_tok > 1

    def shared_experts_size(self):
        """Hidden units of the always-on shared experts, all of them together."""
        return (self.moe_shared_expert_intermediate_size or self.moe_intermediate_size) \
            * self.num_shared_experts

    def is_moe_layer(self, i):
        return self.num_experts is not None and i >= self.first_k_dense_replace


class GroupLimitedGate(nn.Module):
    """Router: softmax or sigmoid scores in float32; the choice adds ``expert_bias``
    and keeps the ``topk_group`` groups whose two best choices sum highest; the
    weights are the unbiased scores of the chosen experts, renormalised when
    ``norm_topk_prob`` (``ModelArgs.renormalizes_choices``), times
    ``routed_scaling_factor``."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.num_experts, bias=False)
        if args.moe_router_enable_expert_bias:
            self.expert_bias = mx.zeros((args.num_experts,))
        self.top_k = args.num_experts_per_tok
        self.sigmoid = args.score_function == "sigmoid"
        self.n_group, self.topk_group = args.n_group, args.topk_group
        self.renormalize = args.renormalizes_choices()
        self.dropped_score = args.dropped_group_score
        self.scaling = args.routed_scaling_factor
        self.float32_logits = args.router_dtype in ("fp32", "float32")

    def __call__(self, x):
        if self.float32_logits and isinstance(self.gate_proj, nn.Linear):
            logits = x.astype(mx.float32) @ self.gate_proj.weight.astype(mx.float32).T
        else:  # quantized router (mlx-lm conversions keep it at 8 bits)
            logits = self.gate_proj(x).astype(mx.float32)
        scores = mx.sigmoid(logits) if self.sigmoid else mx.softmax(logits, axis=-1, precise=True)
        choice = scores
        if "expert_bias" in self:
            choice = choice + self.expert_bias.astype(mx.float32)
        if self.n_group > 1:
            choice = limit_to_groups(choice, self.n_group, self.topk_group,
                                     lambda g: mx.topk(g, 2, axis=-1).sum(axis=-1),
                                     self.dropped_score)
        indices = topk_indices(choice, self.top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        if self.renormalize:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
        return indices, weights * self.scaling


class BailingMoE(SparseMoE):
    """Routed experts weighted by :class:`GroupLimitedGate` plus ``shared_experts``."""

    def __init__(self, args: ModelArgs):
        act = activation(args.hidden_act)
        shared = None
        if args.num_shared_experts > 0 and args.moe_router_enable_shared_expert:
            shared = SharedExpert(MLP(args.hidden_size, args.shared_experts_size(), act,
                                      args.use_bias), "shared_experts")
        switch = SwitchGLU(args.hidden_size, args.moe_intermediate_size, args.num_experts, act,
                           bias=args.use_bias)
        super().__init__(args.hidden_size, args.moe_intermediate_size, args.num_experts,
                         args.num_experts_per_tok, shared=shared, switch=switch)
        self.gate = GroupLimitedGate(args)

    def route(self, x):
        return self.gate(x)


def normalize_head_columns(w):
    """``w / ||w[:, j]||`` per column; None when ``w`` is quantized or already
    normalised (checkpoints converted here or by mlx-lm), so loading twice is exact."""
    if not mx.issubdtype(w.dtype, mx.floating):
        return None
    norms = mx.linalg.norm(w.astype(mx.float32), axis=0, keepdims=True)
    if mx.all(mx.abs(norms - 1.0) < 1e-3).item():
        return None
    return (w / (norms + 1e-7)).astype(w.dtype)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                self.mixer(args, i, norm),
                BailingMoE(args) if args.is_moe_layer(i) else
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.use_bias),
                norm,
            )
            for i in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    @staticmethod
    def qk_norm(args, norm):
        """Bailing's optional per-head QK-norm (a :class:`QKNorm`, or None)."""
        return (QKNorm(norm, names=("query_layernorm", "key_layernorm"))
                if args.use_qk_norm else None)

    def mixer(self, args, i, norm):
        """Layer ``i``'s token mixer (here always softmax attention; Bailing Linear
        overrides it)."""
        rotary = args.rotary_dim or int(args.head_dim * args.partial_rotary_factor)
        return Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                         args.head_dim, config_rope(args, rotary),
                         qk_norm=self.qk_norm(args, norm),
                         projections=Projections(bias=args.use_qkv_bias, o_bias=args.use_bias,
                                                 fused_qkv=True))

    def sanitize(self, weights):
        n = self.args.num_hidden_layers
        out = {}
        for key, value in weights.items():
            layer = re.match(r"model\.layers\.(\d+)\.", key)
            if layer and int(layer.group(1)) >= n:  # multi-token-prediction layers
                continue
            for pattern, repl in RENAMES:
                key = re.sub(pattern, repl, key)
            out[key] = value
        weights = super().sanitize(out)
        if self.args.norm_head and "lm_head.weight" in weights:
            head = normalize_head_columns(weights["lm_head.weight"])
            if head is not None:
                weights["lm_head.weight"] = head
        for i in range(n):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts)
        return weights
