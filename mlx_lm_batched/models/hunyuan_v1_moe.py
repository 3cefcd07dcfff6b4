"""Hunyuan (v1, MoE): Hunyuan dense blocks whose MLP is a softmax top-k router
(``gate.wg``, weights renormalised over the chosen experts unless
``norm_topk_prob`` is false) over SwiGLU experts, plus an always-on ``shared_mlp``
(``use_mixed_mlp_moe``). ``moe_topk``, ``moe_intermediate_size`` (expert width,
default ``intermediate_size``) and ``num_shared_expert`` (the shared MLP's width in
units of ``intermediate_size``) may be one value or one per layer. With
``use_cla``, each group of ``cla_share_factor`` layers shares its first layer's
key/value projections (cross-layer attention, :mod:`.cla`)."""

from dataclasses import dataclass
from typing import List, Optional, Union

from ..layers.attention import Attention
from ..layers.cla import CrossLayerAttention, ProjectionRelay
from ..layers.mlp import MLP
from ..layers.moe import SharedExpert, SparseMoE, stack_experts
from . import hunyuan_v1_dense


def per_layer(value, i):
    """``value`` for layer ``i``: one value for every layer, or a list of them."""
    return value[i] if isinstance(value, (list, tuple)) else value


@dataclass
class ModelArgs(hunyuan_v1_dense.ModelArgs):
    num_experts: int = 1
    moe_topk: Union[int, List[int]] = 1
    moe_intermediate_size: Optional[Union[int, List[int]]] = None
    num_shared_expert: Union[int, List[int]] = 1
    use_mixed_mlp_moe: bool = True
    norm_topk_prob: bool = True
    use_cla: bool = False
    cla_share_factor: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.use_cla and not (isinstance(self.cla_share_factor, int)
                                 and self.cla_share_factor >= 1):
            raise ValueError(f"cla_share_factor must be an integer >= 1, "
                             f"got {self.cla_share_factor!r}")

    def top_k(self, i):
        return per_layer(self.moe_topk, i)

    def is_moe_layer(self, i):
        return True

    def projects_kv(self, i):
        """Whether layer ``i`` has key/value projections of its own."""
        return not self.use_cla or i % self.cla_share_factor == 0


class Model(hunyuan_v1_dense.Model):
    def __init__(self, args: ModelArgs):
        def make_mlp(i):
            if not args.is_moe_layer(i):
                return MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
            shared = None
            if args.use_mixed_mlp_moe:
                width = int(args.intermediate_size * per_layer(args.num_shared_expert, i))
                shared = SharedExpert(MLP(args.hidden_size, width, args.hidden_act), "shared_mlp")
            experts = per_layer(args.moe_intermediate_size, i) or args.intermediate_size
            return SparseMoE(args.hidden_size, experts, args.num_experts, args.top_k(i),
                             normalize=args.norm_topk_prob, shared=shared)

        relay = ProjectionRelay()
        n = args.num_hidden_layers

        def make_attention(i, *a, **k):
            if not args.use_cla:
                return Attention(*a, **k)
            last = i + 1 == n or args.projects_kv(i + 1)
            return CrossLayerAttention(*a, relay=relay, produces=args.projects_kv(i), last=last,
                                       **k)

        super().__init__(args, make_mlp=make_mlp, make_attention=make_attention)

    def sanitize(self, weights):
        weights = {k.replace(".mlp.gate.wg.", ".mlp.gate."): v for k, v in weights.items()}
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe_layer(i):
                stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts)
        return weights
