"""LFM2-MoE: LFM2's conv/attention hybrid whose first ``num_dense_layers`` keep a
SwiGLU MLP and the rest a sigmoid-routed MoE (choice biased by ``expert_bias``)."""

from dataclasses import dataclass

import mlx.core as mx

from ..layers.mlp import MLP
from ..layers.moe import SparseMoE, stack_experts, topk_indices
from . import lfm2


@dataclass
class ModelArgs(lfm2.ModelArgs):
    moe_intermediate_size: int = 1792
    num_dense_layers: int = 2
    num_experts: int = 32
    num_experts_per_tok: int = 4
    use_expert_bias: bool = True
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True


class SigmoidMoE(SparseMoE):
    """Sigmoid scores; top-k by score plus ``expert_bias``; weights are the unbiased
    scores, optionally normalised, times ``routed_scaling_factor``."""

    def __init__(self, args):
        super().__init__(args.hidden_size, args.moe_intermediate_size, args.num_experts,
                         args.num_experts_per_tok, normalize=args.norm_topk_prob)
        if args.use_expert_bias:
            self.expert_bias = mx.zeros((args.num_experts,))
        self.scaling = args.routed_scaling_factor

    def route(self, x):
        scores = mx.sigmoid(self.gate(x).astype(mx.float32))
        choice = scores + self.expert_bias if "expert_bias" in self else scores
        indices = topk_indices(choice, self.top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1)
        if self.normalize:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-6)
        return indices, weights * self.scaling


class Model(lfm2.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, lambda i: MLP(args.hidden_size, args.intermediate_size)
                         if i < args.num_dense_layers else SigmoidMoE(args))

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        for i in range(self.args.num_dense_layers, self.args.num_hidden_layers):
            stack_experts(weights, f"model.layers.{i}.feed_forward", self.args.num_experts,
                          names={"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"})
        return weights
