"""TeleChat 3: Llama's blocks (GQA, RoPE, SwiGLU, RMSNorm) with an untied head by
default."""

from dataclasses import dataclass

from . import llama


@dataclass
class ModelArgs(llama.ModelArgs):
    tie_word_embeddings: bool = False


class Model(llama.Model):
    pass
