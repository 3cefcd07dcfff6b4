"""Seed-OSS (ByteDance): llama blocks whose q/k/v and output projections have
separate bias flags (``attention_bias``, ``attention_out_bias``)."""

from dataclasses import dataclass

from . import llama
from .llama import Model  # noqa: F401


@dataclass
class ModelArgs(llama.ModelArgs):
    attention_bias: bool = True
    attention_out_bias: bool = False
    tie_word_embeddings: bool = False
