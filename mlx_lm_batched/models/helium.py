"""Helium (Kyutai): llama blocks with interleaved ("traditional") RoPE, optional
q/k/v and MLP biases, and an unbiased ``o_proj``."""

from dataclasses import dataclass

from . import llama
from .llama import Model  # noqa: F401


@dataclass
class ModelArgs(llama.ModelArgs):
    rms_norm_eps: float = 1e-8
    attention_out_bias: bool = False
    rope_traditional: bool = True
    tie_word_embeddings: bool = False
