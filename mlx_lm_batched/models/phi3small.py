"""Phi-3-small: LayerNorm blocks, one ``query_key_value`` projection laid out per
key/value group, a clipped GeGeLU MLP, muP scalings, and block-sparse attention
(local blocks + per-head vertical stripes, :class:`~..layers.masks.BlockSparse`) on
every layer but each ``dense_attention_every_n_layers``-th one.

Layer ``i`` is dense when ``(i + 1) % dense_attention_every_n_layers == 0``, as
Microsoft's ``modeling_phi3_small.py`` decides (mlx-lm 0.32 marks ``i % n == 0``
block-sparse instead: the same layers only for ``n == 2``). The block pattern is
exact here under padding, chunked prefill and decode (blocks counted from each row's
first real token, causal inside a block)."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, Scores
from ..layers.blocks import PreNormBlock
from ..layers.masks import BlockSparse
from ..layers.norms import LayerNorm
from ..layers.rope import RoPE
from ..layers.stack import CausalLM
from .common import StackArgs, init_causal_lm

# Token ids Phi-3-small's tokenizer reserves but never emits: their logits are -inf.
DUMMY_TOKEN_IDS = (100256, 100258, 100259, 100260, 100264, 100265, *range(100267, 100352))


@dataclass
class ModelArgs(StackArgs):
    dense_attention_every_n_layers: int
    ff_intermediate_size: int
    gegelu_limit: float
    num_attention_heads: int
    layer_norm_epsilon: float
    vocab_size: int
    num_key_value_heads: int
    mup_attn_multiplier: float = 1.0
    mup_use_scaling: bool = True
    mup_embedding_multiplier: float = 10.0
    mup_width_multiplier: float = 8.0
    rope_embedding_base: float = 1000000.0
    rope_position_scale: float = 1.0
    rope_theta: Optional[float] = None  # transformers 5's rope_parameters, when given
    rope_scaling: Optional[dict] = None
    blocksparse_block_size: int = 64
    blocksparse_num_local_blocks: int = 16
    blocksparse_vert_stride: int = 8
    blocksparse_homo_head_pattern: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.rope_theta is not None:
            self.rope_embedding_base = self.rope_theta
        scaling = self.rope_scaling or {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in (None, "default"):
            # Phi-3-small-128k's LongRoPE ("su") has its own short/long mscales; mlx-lm
            # 0.32 ignores rope_scaling here. Refuse rather than rotate wrongly.
            raise NotImplementedError(f"phi3small: rope_scaling type '{rope_type}' is not "
                                      "supported (only the default RoPE)")
        if self.dense_attention_every_n_layers < 1:
            raise ValueError("phi3small: dense_attention_every_n_layers must be >= 1, got "
                             f"{self.dense_attention_every_n_layers}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("phi3small: num_attention_heads must be a multiple of "
                             "num_key_value_heads")


class GegeluMLP(nn.Module):
    """``down_proj(gelu_quick(a) * (b + 1))`` where ``up_proj`` interleaves ``a`` and
    ``b`` feature by feature; ``a`` is clipped above and ``b`` on both sides at
    ``limit`` (infinities pass through)."""

    def __init__(self, hidden_size, intermediate_size, limit):
        super().__init__()
        self.limit = limit
        self.up_proj = nn.Linear(hidden_size, 2 * intermediate_size)
        self.down_proj = nn.Linear(intermediate_size, hidden_size)

    def __call__(self, x):
        h = self.up_proj(x)
        a, b = h[..., ::2], h[..., 1::2]
        a = mx.where(mx.isinf(a), a, mx.minimum(a, self.limit))
        b = mx.where(mx.isinf(b), b, mx.clip(b, -self.limit, self.limit))
        return self.down_proj(a * mx.sigmoid(1.702 * a) * (b + 1.0))


class GroupedQKVAttention(Attention):
    """The shared attention reading Phi-3-small's ``query_key_value``: per key/value
    head, its ``heads / kv_heads`` queries, then its key, then its value."""

    def project(self, x):
        B, L, _ = x.shape
        group = self.n_heads // self.n_kv_heads
        qkv = self.query_key_value(x).reshape(B, L, self.n_kv_heads, group + 2, self.head_dim)
        q = qkv[..., :group, :].reshape(B, L, -1)
        k = qkv[..., group, :].reshape(B, L, -1)
        v = qkv[..., group + 1, :].reshape(B, L, -1)
        return q, k, v


def is_dense_layer(args, i):
    """Microsoft's rule: every ``dense_attention_every_n_layers``-th layer is dense."""
    return (i + 1) % args.dense_attention_every_n_layers == 0


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_heads, n_kv = args.num_attention_heads, args.num_key_value_heads
        head_dim = args.hidden_size // n_heads
        scale = (args.mup_attn_multiplier / head_dim if args.mup_use_scaling
                 else head_dim**-0.5)
        rope = RoPE(head_dim, base=args.rope_embedding_base, scale=args.rope_position_scale)
        norm = lambda: LayerNorm(args.hidden_size, args.layer_norm_epsilon)
        layers = [
            PreNormBlock(
                GroupedQKVAttention(args.hidden_size, n_heads, n_kv, head_dim, rope,
                                    projections=Projections(bias=True, fused_qkv=True,
                                                            qkv_name="query_key_value"),
                                    scores=Scores(scale=scale)),
                GegeluMLP(args.hidden_size, args.ff_intermediate_size, args.gegelu_limit),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(),
                       embed_scale=args.mup_embedding_multiplier or None)
        pattern = BlockSparse(args.blocksparse_block_size, args.blocksparse_num_local_blocks,
                              args.blocksparse_vert_stride, n_heads,
                              args.blocksparse_homo_head_pattern)
        self.layer_block_sparse = [None if is_dense_layer(args, i) else pattern
                                   for i in range(args.num_hidden_layers)]
        if args.mup_width_multiplier:
            self.logit_scale = 1.0 / args.mup_width_multiplier
        # mlx-lm's attribute name: the ids whose logits are masked out.
        dummy = [t for t in DUMMY_TOKEN_IDS if t < args.vocab_size]
        self._dummy_tokenizer_ids = mx.array(dummy) if dummy else None

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        if self._dummy_tokenizer_ids is not None:
            out[..., self._dummy_tokenizer_ids] = -float("inf")
        return out

    def sanitize(self, weights):
        """Microsoft's names (``final_layernorm``, ``self_attn.dense``) to the shared
        blocks' (``norm``, ``o_proj``)."""
        renamed = {}
        for k, v in weights.items():
            k = k.replace("model.final_layernorm.", "model.norm.")
            renamed[k.replace(".self_attn.dense.", ".self_attn.o_proj.")] = v
        return super().sanitize(renamed)
