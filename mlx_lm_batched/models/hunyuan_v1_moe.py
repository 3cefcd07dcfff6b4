"""Hunyuan (v1, MoE): Hunyuan dense blocks whose MLP is a softmax top-k router
(``gate.wg``, weights renormalised over the chosen experts) over SwiGLU experts of
``intermediate_size``, plus an always-on ``shared_mlp``. ``moe_topk`` may be one
value or one per layer."""

from dataclasses import dataclass
from typing import List, Union

from . import hunyuan_v1_dense
from .layers import MLP
from .moe import SparseMoE, stack_experts


@dataclass
class ModelArgs(hunyuan_v1_dense.ModelArgs):
    num_experts: int = 1
    moe_topk: Union[int, List[int]] = 1

    def top_k(self, i):
        return self.moe_topk if isinstance(self.moe_topk, int) else self.moe_topk[i]


class Model(hunyuan_v1_dense.Model):
    def __init__(self, args: ModelArgs):
        def make_mlp(i):
            shared = MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
            return SparseMoE(args.hidden_size, args.intermediate_size, args.num_experts,
                             args.top_k(i), normalize=True, shared=shared,
                             shared_name="shared_mlp")

        super().__init__(args, make_mlp=make_mlp)

    def sanitize(self, weights):
        weights = {k.replace(".mlp.gate.wg.", ".mlp.gate."): v for k, v in weights.items()}
        weights = super().sanitize(weights)
        for i in range(self.args.num_hidden_layers):
            stack_experts(weights, f"model.layers.{i}.mlp", self.args.num_experts)
        return weights
