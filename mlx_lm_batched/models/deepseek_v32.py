"""DeepSeek V3.2: DeepSeek V3's model whose latent attention is sparse (DSA): an
indexer picks each query's ``index_topk`` keys (``layers/sparse_attention.py``).
The indexer rotates its first ``qk_rope_head_dim`` features in halves (GLM-5's
``glm_moe_dsa``: in adjacent pairs, ``indexer_rope_interleave``)."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.rope import make_rope
from ..layers.mla import LatentDims
from ..layers.sparse_attention import SparseIndexer, SparseLatentAttention
from . import deepseek_v2, deepseek_v3
from .deepseek_v3 import SigmoidGate


@dataclass
class ModelArgs(deepseek_v3.ModelArgs):
    max_position_embeddings: int = 163840
    index_topk: int = 2048
    index_head_dim: int = 128
    index_n_heads: int = 64
    mlp_layer_types: Optional[List[str]] = None
    indexer_rope_interleave: bool = False
    indexer_types: Optional[List[str]] = None

    def __post_init__(self):
        if self.indexer_types is not None and any(t != "full" for t in self.indexer_types):
            # GLM-5's "shared" layers reuse another layer's top-k selection.
            raise NotImplementedError(f"{self.model_type}: indexer_types other than 'full' "
                                      f"(layers sharing another layer's top-k) are not supported")

    def is_moe_layer(self, i):
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types[i] == "sparse"
        return super().is_moe_layer(i)


class Model(deepseek_v2.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, gate=SigmoidGate)

    def make_attention(self, args, rope, scale, position_scale):
        index_rope = make_rope(args.qk_rope_head_dim, args.rope_theta,
                               args.indexer_rope_interleave, args.rope_scaling,
                               args.max_position_embeddings)
        indexer = SparseIndexer(args.hidden_size, args.q_lora_rank, args.index_n_heads,
                                args.index_head_dim, args.qk_rope_head_dim, index_rope,
                                args.index_topk)
        return SparseLatentAttention(
            args.hidden_size, args.num_attention_heads, LatentDims.from_args(args),
            rope, scale, args.attention_bias, position_scale, indexer=indexer)
