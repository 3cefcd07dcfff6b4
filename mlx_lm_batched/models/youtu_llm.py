"""Youtu-LLM (Tencent): DeepSeek V3's multi-head latent attention with dense SwiGLU
MLPs in every layer (no experts) and tied embeddings by default. transformers 5
names the type ``youtu``; the hub's remote-code checkpoints say ``youtu_llm``."""

from dataclasses import dataclass
from typing import Optional

from . import deepseek_v3
from .args import require_values


@dataclass
class ModelArgs(deepseek_v3.ModelArgs):
    # transformers' YoutuConfig defaults (Youtu-LLM-2B).
    vocab_size: int = 128256
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    max_position_embeddings: int = 131072
    n_routed_experts: Optional[int] = None
    tie_word_embeddings: bool = True
    # mlx-lm's field: DeepSeek's attention rotates adjacent pairs here, always.
    rope_traditional: bool = True

    def __post_init__(self):
        super().__post_init__()
        require_values(self, rope_traditional=(True,))

    def is_moe_layer(self, i):
        # Every layer is dense (YoutuConfig drops DeepSeek's expert fields).
        return False


class Model(deepseek_v3.Model):
    pass
