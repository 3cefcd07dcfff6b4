"""Block-sparse attention (MiniMax M3): a light indexer scores every key for each
query, max-pools the scores over blocks of ``block_size`` consecutive keys, and the
query attends only the ``topk_blocks`` best blocks (its own ``local_blocks`` most
recent blocks always among them).

Exact per row under padding: blocks are counted over each row's *positions* (0 at its
first real token), not over cache slots, so left padding, rows joining a running
batch and gaps a driver view leaves never move a block boundary. A key's position is
the count of real keys before it (real: allowed by the row's last query under the
layer's mask); keys the mask forbids score ``-inf`` before pooling, and the
selection is intersected with that mask. The selection is a threshold at the k-th
largest block score (ties all kept). Padding queries keep the plain mask (their
outputs are never read, but must stay finite).

The cache holds the indexer's keys as one extra head of the layer's key/value cache
(padded to the wider head size, zero values), as DeepSeek sparse attention does, so
every cache kind, view and file works unchanged.
"""

import mlx.core as mx
import mlx.nn as nn

from .attention import Attention
from .sparse_attention import cache_with_index_keys


class BlockIndexer(nn.Module):
    """The indexer's projections (Hugging Face's ``self_attn.indexer.*``): ``heads``
    query heads and one key head of ``head_dim``, each normed, RoPE on its first
    features (``rope``)."""

    def __init__(self, hidden_size, heads, head_dim, rope, norm, block_size, topk_blocks,
                 local_blocks):
        super().__init__()
        self.heads, self.head_dim, self.rope = heads, head_dim, rope
        self.block_size, self.topk_blocks, self.local_blocks = block_size, topk_blocks, local_blocks
        self.q_proj = nn.Linear(hidden_size, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.q_norm = norm(head_dim)
        self.k_norm = norm(head_dim)

    def keys(self, x, offset):
        """The indexer keys ``(B, 1, L, head_dim)`` of ``x``."""
        B, L, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(B, L, 1, -1)).transpose(0, 2, 1, 3)
        return self.rope(k, offset)

    def select(self, x, keys, mask, offset):
        """``mask`` ``(B, 1, L, T)`` narrowed to each query's kept key blocks, per
        indexer head: ``(B, heads, L, T)``. ``keys``: ``(B, 1, T, head_dim)``."""
        if mask is None:  # the one mask path always builds one; be explicit anyway
            raise ValueError("block-sparse attention needs the layer's attention mask")
        B, L, _ = x.shape
        T, bs = keys.shape[2], self.block_size
        n_blocks = -(-T // bs)
        if self.topk_blocks >= n_blocks:  # every block fits the budget
            return mask
        mask = mx.broadcast_to(mask, (B, 1, L, T))
        real = mask[:, 0, -1, :]  # (B, T): the row's real keys, seen by its last query
        key_pos = mx.maximum(mx.cumsum(real.astype(mx.int32), axis=-1) - 1, 0)
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.heads, -1)).transpose(0, 2, 1, 3)
        q = self.rope(q, offset)
        scores = q.astype(mx.float32) @ keys.astype(mx.float32).swapaxes(-1, -2)
        scores = mx.where(mask, scores, -mx.inf)  # (B, heads, L, T)
        # Each row's keys in position order (real slots first, in slot order), then
        # pooled over blocks of positions.
        slots = mx.arange(T)
        by_pos = mx.argsort(mx.where(real, slots, T + slots), axis=-1)
        scores = mx.take_along_axis(scores, mx.broadcast_to(by_pos[:, None, None], scores.shape),
                                    axis=-1)
        scores = mx.pad(scores, [(0, 0)] * 3 + [(0, n_blocks * bs - T)], constant_values=-mx.inf)
        blocks = scores.reshape(B, self.heads, L, n_blocks, bs).max(axis=-1)
        q_pos = offset[:, None] + mx.arange(L)  # (B, L)
        ids = mx.arange(n_blocks)
        q_block = (q_pos // bs)[:, None, :, None]
        local = (ids <= q_block) & (ids > q_block - self.local_blocks)
        blocks = mx.where(local, mx.inf, blocks)
        k = self.topk_blocks
        kth = -mx.partition(-blocks, k - 1, axis=-1)[..., k - 1:k]
        keep = (blocks >= kth) & (blocks > -mx.inf)  # (B, heads, L, n_blocks)
        slot_block = mx.broadcast_to((key_pos // bs)[:, None, None], (B, self.heads, L, T))
        keep = mx.take_along_axis(keep, slot_block, axis=-1) & mask
        return mx.where((q_pos >= 0)[:, None, :, None], keep, mask)


class BlockSparseAttention(Attention):
    """The shared attention (QK-norm, partial RoPE, GQA) restricted to the blocks its
    :class:`BlockIndexer` keeps; one selection per indexer head, shared by the query
    heads of that group (``n_heads // indexer.heads`` each)."""

    def __init__(self, *args, indexer, **kwargs):
        super().__init__(*args, **kwargs)
        if self.n_heads % indexer.heads:
            raise ValueError(f"block-sparse attention: {self.n_heads} heads are not a "
                             f"multiple of the indexer's {indexer.heads}")
        self.indexer = indexer

    def __call__(self, x, mask, offset, cache=None, attention=None):
        q, k, v = self.project(x)
        B, L, _ = x.shape
        q, k = self._heads(q, 0, offset), self._heads(k, 1, offset)
        v = v.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        index_keys = self.indexer.keys(x, offset)
        if cache is not None:
            k, v, index_keys = cache_with_index_keys(cache, k, v, index_keys, offset)
        keep = self.indexer.select(x, index_keys, mask, offset)
        if keep is not mask:
            keep = mx.repeat(keep, self.n_heads // self.indexer.heads, axis=1)
        return self._attend(q, k, v, keep, attention)
