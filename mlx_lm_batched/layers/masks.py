"""The one place attention masks are built.

Coordinates. A batch cache stores every row in one shared *slot* frame: slot ``s``
holds the ``s``-th token fed to the batch, padding included, and all rows advance
together. Row ``b`` is left-padded by ``left_padding[b]`` slots, so the token in slot
``s`` has position ``s - left_padding[b]`` in that row; negative positions are padding.

The model receives ``offset[b]``: the position of its first input column in row ``b``
(negative during a left-padded prefill, equal to the number of cached real tokens in
decode). With ``slots_before`` the number of slots already cached, the row's padding
is ``slots_before - offset[b]``: the mask needs nothing but the offsets and the key
slots a cache is about to return.

A query may attend a key when the key is a real token of its row, not in the future,
and (with a window) less than ``window`` positions back, and (with a chunk, Llama 4's
chunked attention) in the same chunk of ``chunk`` positions: ``key_pos // chunk ==
query_pos // chunk``. Chunks are counted in each row's own positions, so left padding
does not move a row's chunk boundaries. Every query may also attend
its own slot: a padding query would otherwise have no key at all and produce NaN,
which would leak through the zero attention weights of later layers (0 * NaN = NaN).

A block-sparse layer (Phi-3-small, :class:`BlockSparse`) also keeps, per head, only
the keys of the query's last ``local_blocks`` blocks and of that head's "vertical"
blocks; its mask is ``(B, heads, L, K)``. Blocks are counted in each row's own
positions too, so the pattern is the same under padding, chunked prefill and decode.

A mask built over keys in slot order (:meth:`LayerCache.keys_in_slot_order`, or no
cache) comes back as a :class:`CausalMask`: the same boolean array, typed to say that no
query attends a key after its own slot, so attention may skip those keys.
"""

from dataclasses import dataclass

import mlx.core as mx

from ..cache.sinks import sink_ring_mask


@dataclass(frozen=True)
class BlockSparse:
    """Phi-3-small's block-sparse attention pattern (Microsoft's
    ``triton_flash_blocksparse_attn``), applied on top of causality.

    Positions are grouped in blocks of ``block_size``. Head ``h`` attends a key
    block when it is one of the query block's ``local_blocks`` latest blocks (the
    query's own included) or when ``(key_block + shift_h + 1) % vert_stride == 0``,
    with ``shift_h = h * max(1, vert_stride // n_heads)`` (every head sees a
    different vertical stripe) or ``shift_h = 0`` for all heads (``homo_head``).
    Hashable: layers with the same pattern share one mask.
    """

    block_size: int
    local_blocks: int
    vert_stride: int
    n_heads: int
    homo_head: bool = False

    def __post_init__(self):
        for name in ("block_size", "local_blocks", "vert_stride", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"block-sparse {name} must be >= 1, got {getattr(self, name)}")

    def head_shifts(self):
        """``(heads,)`` offset of each head's vertical stripes."""
        step = 0 if self.homo_head else max(1, self.vert_stride // self.n_heads)
        return mx.arange(self.n_heads) * step

    def allows(self, query_pos, key_pos):
        """Boolean ``(..., heads, L, K)`` from positions ``(..., 1, L, 1)`` and
        ``(..., 1, 1, K)`` (causality is the caller's)."""
        q_block, k_block = query_pos // self.block_size, key_pos // self.block_size
        local = q_block - k_block < self.local_blocks
        shifts = self.head_shifts()[:, None, None]
        vertical = (k_block + shifts + 1) % self.vert_stride == 0
        return local | vertical


class CausalMask(mx.array):
    """A boolean mask ``(..., L, K)`` (an ``mx.array`` like any other) whose keys hold
    consecutive slots ending at the last query's: query ``i`` attends no key after
    index ``K - L + i`` and, with a sliding ``window``, none before
    ``K - L + i - window + 1``. ``cpu_ops.attention`` skips, for each block of queries,
    the keys outside that range (half the work of a long causal prefill; all but a
    window's worth with a window). Any op on it (a slice, ``&``) gives a plain array,
    which claims nothing."""

    def __init__(self, mask, window=None):
        super().__init__(mask)
        self.window = window


def attention_mask(key_slots, slots_before, query_len, offset, window=None, chunk=None,
                   block_sparse=None):
    """Boolean mask ``(B, 1, query_len, K)`` (``(B, heads, query_len, K)`` with
    ``block_sparse``); True where a query may attend a key.

    Args:
        key_slots: ``(K,)`` int array, the slot held by each key the cache returns
            (``-1`` for an empty slot).
        slots_before: slots already cached before these queries (same for all rows).
        query_len: number of new tokens (queries) per row.
        offset: ``(B,)`` int array, position of each row's first query.
        window: sliding-window length in tokens, or None for full attention.
        chunk: attention chunk length in tokens (keys of the query's own chunk
            only), or None.
        block_sparse: a :class:`BlockSparse` pattern, or None.
    """
    offset = mx.array(offset) if not isinstance(offset, mx.array) else offset
    query_slots = slots_before + mx.arange(query_len)  # (L,)
    left_padding = slots_before - offset.astype(mx.int32)  # (B,)
    q = query_slots[None, :, None]
    k = key_slots[None, None, :]
    allowed = (k <= q) & (k >= left_padding[:, None, None])
    if window is not None:
        allowed = allowed & (q - k < window)
    if chunk is not None:
        pad = left_padding[:, None, None]
        allowed = allowed & ((k - pad) // chunk == (q - pad) // chunk)
    allowed = (allowed | (k == q))[:, None]
    if block_sparse is not None:
        pad = left_padding[:, None, None, None]
        pattern = block_sparse.allows(q[:, None] - pad, k[:, None] - pad)
        allowed = (allowed & pattern) | (k == q)[:, None]
    return allowed


def causal_mask(query_len, offset, window=None, chunk=None, block_sparse=None):
    """Mask for a forward pass without a cache: keys are the queries themselves."""
    return CausalMask(attention_mask(mx.arange(query_len), 0, query_len, offset, window,
                                     chunk, block_sparse), window)


def masks_for_layers(caches, windows, query_len, offset, chunks=None, block_sparse=None):
    """One mask per layer, each built once per distinct (cache layout, window, chunk,
    block pattern).

    ``caches`` is the per-layer cache list (or None), ``windows`` the per-layer
    sliding window (None for global layers), ``chunks`` the per-layer attention
    chunk (None for unchunked layers; ``chunks=None``: no layer is chunked),
    ``block_sparse`` the per-layer :class:`BlockSparse` pattern (None for dense
    layers; ``block_sparse=None``: no layer is block-sparse). Layers that share a
    cache layout, a window, a chunk and a pattern share the same mask array.
    """
    chunks = chunks if chunks is not None else [None] * len(windows)
    block_sparse = block_sparse if block_sparse is not None else [None] * len(windows)
    built = {}
    masks = []
    for i, (window, chunk, pattern) in enumerate(zip(windows, chunks, block_sparse)):
        cache = None if caches is None else caches[i]
        if cache is None:
            key = ("none", window, chunk, pattern)
            if key not in built:
                built[key] = causal_mask(query_len, offset, window, chunk, pattern)
        else:
            window = cache.effective_window(window)
            key = (cache.layout_key(), window, chunk, pattern)
            if key not in built and getattr(cache, "keep", 0):
                if chunk is not None or pattern is not None:
                    raise NotImplementedError("a RotatingKVCache with keep>0 (attention sinks) "
                                              "serves plain or sliding-window attention only")
                built[key] = sink_ring_mask(cache.key_slots(query_len), cache.size, query_len,
                                            offset, cache.max_size, cache.keep, window)
            elif key not in built:
                built[key] = attention_mask(cache.key_slots(query_len), cache.size, query_len,
                                            offset, window, chunk, pattern)
                if cache.keys_in_slot_order(query_len):
                    built[key] = CausalMask(built[key], window)
        masks.append(built[key])
    return masks
