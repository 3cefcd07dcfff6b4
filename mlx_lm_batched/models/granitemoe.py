"""Granite MoE: Mixtral-shaped blocks with Granite's multipliers (embeddings, residual
branches, attention scale, logits divisor). The router takes the top-k logits and
softmaxes over them; experts come fused (``input_linear`` = gate then up)."""

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..layers.mlp import activation
from ..layers.moe import SparseMoE, softmax_topk
from . import granite


@dataclass
class ModelArgs(granite.ModelArgs):
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    tie_word_embeddings: bool = True


class GraniteMoE(SparseMoE):
    """The router is ``router.layer``; softmax over the top-k logits equals the top-k
    softmax probabilities renormalised."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.hidden_size, args.intermediate_size, args.num_local_experts,
                         args.num_experts_per_tok, activation(args.hidden_act), normalize=True)
        self.pop("gate")
        self.router = nn.Module()
        self.router.layer = nn.Linear(args.hidden_size, args.num_local_experts, bias=False)

    def route(self, x):
        return softmax_topk(self.router.layer(x), self.top_k, normalize=True)


class Model(granite.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, lambda: GraniteMoE(args), mlp_name="block_sparse_moe")

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        out = {}
        for k, v in weights.items():
            if k.endswith("block_sparse_moe.input_linear.weight"):
                gate, up = mx.split(v, 2, axis=1)
                prefix = k[: -len("input_linear.weight")] + "switch_mlp."
                out[prefix + "gate_proj.weight"] = gate
                out[prefix + "up_proj.weight"] = up
                continue
            k = k.replace("block_sparse_moe.output_linear.", "block_sparse_moe.switch_mlp.down_proj.")
            out[k] = v
        return out
