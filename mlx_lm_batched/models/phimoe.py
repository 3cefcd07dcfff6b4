"""Phi-3.5-MoE (``phimoe``): Mixtral-shaped blocks with LayerNorms (with bias), biased
attention and head, and SparseMixer routing: two experts chosen one after the other,
each weighted by a softmax over only the logits close to its own.

LongRoPE: the attention factor is ``short_mscale`` (real configs set ``long_mscale``
to the same value); short/long factors switch per row at the pretraining length as
in Phi-3 (transformers 5's phimoe keeps the short ones beyond it).
"""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import activation
from ..layers.moe import SparseMoE
from ..layers.norms import LayerNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM, DecoderStack
from .common import DecoderArgs
from .mixtral import stack_mixtral_experts


@dataclass
class ModelArgs(DecoderArgs):
    num_local_experts: int = 16
    num_experts_per_tok: int = 2
    router_jitter_noise: float = 0.01
    rms_norm_eps: float = 1e-5  # the LayerNorms' eps
    rope_theta: float = 1e6
    attention_bias: bool = False
    lm_head_bias: bool = False
    sliding_window: Optional[int] = None
    max_position_embeddings: int = 131072  # transformers' and mlx-lm's default
    # Older configs keep it next to rope_scaling; longrope reads it from there.
    original_max_position_embeddings: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        if self.max_position_embeddings is None:  # an explicit null: the default
            self.max_position_embeddings = 131072
        original = self.original_max_position_embeddings
        if original is not None and isinstance(self.rope_scaling, dict):
            self.rope_scaling = {"original_max_position_embeddings": original,
                                 **self.rope_scaling}


def sparsemixer_choice(scores, jitter_eps, exclude=None):
    """One SparseMixer pick: the best expert (not ``exclude``) and its weight, a softmax
    over the logits within a relative ``2 * jitter_eps`` of the best one."""
    candidates = scores
    if exclude is not None:
        candidates = mx.put_along_axis(scores, exclude, mx.array(-mx.inf, scores.dtype), axis=-1)
    index = mx.stop_gradient(mx.argmax(candidates, axis=-1, keepdims=True))  # mx.grad works
    best = mx.take_along_axis(candidates, index, axis=-1)
    far = (best - scores) / mx.maximum(mx.abs(scores), best) > 2 * jitter_eps
    probs = mx.softmax(mx.where(far, -mx.inf, candidates), axis=-1, precise=True)
    return index, mx.take_along_axis(probs, index, axis=-1)


def sparsemixer(gates, *, top_k, jitter_eps):
    """mlx-lm's ``phimoe.sparsemixer``: ``top_k`` SparseMixer picks in turn, each excluding
    the experts picked before it; ``(indices, weights)``, both ``(..., top_k)``."""
    picks, weights = [], []
    for _ in range(top_k):
        exclude = mx.concatenate(picks, -1) if picks else None
        index, weight = sparsemixer_choice(gates, jitter_eps, exclude=exclude)
        picks.append(index)
        weights.append(weight)
    return mx.concatenate(picks, -1), mx.concatenate(weights, -1)


class SparseMixerMoE(SparseMoE):
    def __init__(self, args: ModelArgs):
        super().__init__(args.hidden_size, args.intermediate_size, args.num_local_experts,
                         2, activation(args.hidden_act))
        self.jitter_eps = args.router_jitter_noise

    def route(self, x):
        scores = self.gate(x).astype(mx.float32)
        first, w1 = sparsemixer_choice(scores, self.jitter_eps)
        second, w2 = sparsemixer_choice(scores, self.jitter_eps, exclude=first)
        return mx.concatenate([first, second], -1), mx.concatenate([w1, w2], -1)


def _rope_scaling(scaling):
    """transformers' phimoe scales cos/sin by ``short_mscale``/``long_mscale``."""
    if scaling and "short_mscale" in scaling and scaling.get("attention_factor") is None:
        scaling = dict(scaling, attention_factor=scaling["short_mscale"])
    return scaling


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        rope = make_rope(head_dim, args.rope_theta, args.rope_traditional,
                         _rope_scaling(args.rope_scaling),
                         args.max_position_embeddings)
        norm = lambda: LayerNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          projections=Projections(bias=args.attention_bias)),
                SparseMixerMoE(args),
                norm,
                mlp_name="block_sparse_moe",
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=args.lm_head_bias)
        self.layer_windows = [args.sliding_window] * args.num_hidden_layers

    def sanitize(self, weights):
        return stack_mixtral_experts(super().sanitize(weights), self.args)
