"""GLM-5 (``glm_moe_dsa``): DeepSeek V3.2's sparse-attention model; its indexer
rotates adjacent pairs (interleaved RoPE)."""

from dataclasses import dataclass

from . import deepseek_v32


@dataclass
class ModelArgs(deepseek_v32.ModelArgs):
    vocab_size: int = 154880
    index_n_heads: int = 32
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 202752
    indexer_rope_interleave: bool = True


class Model(deepseek_v32.Model):
    pass
