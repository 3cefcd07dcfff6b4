"""DeepSeek sparse attention (DSA; DeepSeek V3.2, GLM-5): multi-head latent
attention whose queries attend only the ``index_topk`` keys a light "indexer" scores
highest.

The indexer has its own small heads: queries from MLA's normed low-rank query
(``wq_b``), one key per token (``wk`` + LayerNorm), RoPE on the first
``qk_rope_head_dim`` features, and per-token head weights (``weights_proj``). A key's
index score is ``sum_h w_h * relu(q_h . k * scale)``.

Exact under padding: the scores of keys the attention mask forbids (another row's
padding, the future) are ``-inf`` before the top-k, and the selection is intersected
with that mask, so a padded row selects the keys it would select alone (with fewer
allowed keys than ``index_topk``, every allowed key). The selection is a threshold
at the k-th largest score: keys tied with it are all kept (one rule whatever the
batch; a reference that breaks such ties arbitrarily may keep fewer).

The cache holds the indexer's keys as one extra head of the layer's key/value cache
(padded to the wider of the two head sizes, with zero values), so every cache kind,
view and file works unchanged; it costs ``1 / heads`` more cache memory.
"""

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import update_kv
from .attention import scaled_dot_product_attention
from .mla import MultiHeadLatentAttention


def cache_with_index_keys(cache, keys, values, index_keys, offset):
    """Write ``keys``/``values`` ``(B, H, L, D)`` and the indexer's keys (stored as one
    extra head, padded to one width) to ``cache``; return the keys, values and indexer
    keys it holds for this step."""
    H, dk, di = keys.shape[1], keys.shape[-1], index_keys.shape[-1]
    width = max(dk, di)
    pad = lambda t: t if t.shape[-1] == width else mx.pad(
        t, [(0, 0)] * 3 + [(0, width - t.shape[-1])])
    packed_k = mx.concatenate([pad(keys), pad(index_keys.astype(keys.dtype))], axis=1)
    packed_v = mx.concatenate([values, mx.zeros_like(values[:, :1])], axis=1)
    packed_k, packed_v = update_kv(cache, packed_k, packed_v, offset)
    return packed_k[:, :H, :, :dk], packed_v[:, :H], packed_k[:, H:, :, :di]


class SparseIndexer(nn.Module):
    def __init__(self, hidden_size, q_lora_rank, n_heads, head_dim, rope_dims, rope, topk):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dims = n_heads, head_dim, rope_dims
        self.topk = topk
        self.rope = rope
        self.wq_b = nn.Linear(q_lora_rank, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden_size, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(hidden_size, n_heads, bias=False)

    def _rotate(self, t, offset):
        """RoPE on the first ``rope_dims`` features of ``(B, heads, L, D)``."""
        rot = self.rope(t[..., : self.rope_dims], offset)
        return mx.concatenate([rot, t[..., self.rope_dims:]], axis=-1)

    def keys(self, x, offset):
        """The indexer keys ``(B, 1, L, head_dim)`` of ``x``."""
        B, L, _ = x.shape
        return self._rotate(self.k_norm(self.wk(x)).reshape(B, 1, L, -1), offset)

    def select(self, x, q_resid, keys, mask, offset):
        """``mask`` ``(B, 1, L, T)`` narrowed to each query's ``topk`` best keys;
        ``keys``: ``(B, 1, T, head_dim)``, every key the layer attends."""
        B, L, _ = x.shape
        T = keys.shape[2]
        if mask is None:  # the one mask path always builds one; be explicit anyway
            raise ValueError("DeepSeek sparse attention needs the layer's attention mask")
        if self.topk >= T:  # every allowed key is among the top-k
            return mask
        q = self.wq_b(q_resid).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        q = self._rotate(q, offset).astype(mx.float32)
        scores = mx.maximum(q @ keys.astype(mx.float32).swapaxes(-1, -2), 0.0)
        scores = scores * self.head_dim**-0.5  # (B, heads, L, T)
        w = self.weights_proj(x).astype(mx.float32) * self.n_heads**-0.5  # (B, L, heads)
        index = (w.transpose(0, 2, 1)[..., None] * scores).sum(axis=1)  # (B, L, T)
        index = mx.where(mask[:, 0], index, -mx.inf)
        kth = -mx.partition(-index, self.topk - 1, axis=-1)[..., self.topk - 1: self.topk]
        return mask & (index >= kth)[:, None]


class SparseLatentAttention(MultiHeadLatentAttention):
    """Multi-head latent attention restricted to the indexer's top-k keys."""

    def __init__(self, *args, indexer, **kwargs):
        """``args``/``kwargs``: :class:`MultiHeadLatentAttention`'s (``q_lora_rank``
        required: the indexer's queries come from it); ``indexer``: a
        :class:`SparseIndexer`."""
        super().__init__(*args, **kwargs)
        if self.q_lora_rank is None:
            raise ValueError("DeepSeek sparse attention needs q_lora_rank (its indexer "
                             "reads the low-rank query)")
        self.indexer = indexer

    def __call__(self, x, mask, offset, cache=None, attention=None):
        queries, keys, values, q_resid = self.project(x, offset)
        index_keys = self.indexer.keys(x, offset)
        if cache is not None:
            keys, values, index_keys = cache_with_index_keys(cache, keys, values, index_keys,
                                                             offset)
        mask = self.indexer.select(x, q_resid, index_keys, mask, offset)
        out = scaled_dot_product_attention(queries, keys, values, self.scale, mask)
        return self.output(out, x)
