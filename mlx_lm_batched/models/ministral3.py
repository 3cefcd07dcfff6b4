"""Ministral 3: Mistral blocks (optional window on every layer) whose rotated queries
are scaled by Llama 4's long-context temperature
``1 + beta * log(1 + floor(position / original_max_position_embeddings))``, with
``beta = llama_4_scaling_beta`` from the RoPE parameters."""

from dataclasses import dataclass
from functools import partial
from typing import Optional

import mlx.core as mx

from ..layers.attention_options import Scores
from . import llama


@dataclass
class ModelArgs(llama.ModelArgs):
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: Optional[dict] = None

    def query_scaling(self):
        """``(beta, original context)`` of the query temperature, or None."""
        for params in (self.rope_scaling, self.rope_parameters):
            if isinstance(params, dict) and params.get("llama_4_scaling_beta"):
                return (params["llama_4_scaling_beta"],
                        params.get("original_max_position_embeddings")
                        or self.max_position_embeddings)
        return None


def llama4_query_factor(positions, beta, context):
    """Query factor at ``positions`` (transformers' ``get_llama_4_attn_scale``)."""
    return 1 + beta * mx.log(1 + mx.floor(positions / context))


def llama4_query_scale(beta, context):
    """Position -> query factor; a ``partial`` of a module function, so models copy."""
    return partial(llama4_query_factor, beta=beta, context=context)


class Model(llama.Model):
    def __init__(self, args: ModelArgs):
        scaling = args.query_scaling()
        super().__init__(args, attention_kwargs=dict(scores=Scores(
            position_scale=llama4_query_scale(*scaling) if scaling else None)))
