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
"""

import mlx.core as mx


def attention_mask(key_slots, slots_before, query_len, offset, window=None, chunk=None):
    """Boolean mask ``(B, 1, query_len, K)``; True where a query may attend a key.

    Args:
        key_slots: ``(K,)`` int array, the slot held by each key the cache returns
            (``-1`` for an empty slot).
        slots_before: slots already cached before these queries (same for all rows).
        query_len: number of new tokens (queries) per row.
        offset: ``(B,)`` int array, position of each row's first query.
        window: sliding-window length in tokens, or None for full attention.
        chunk: attention chunk length in tokens (keys of the query's own chunk
            only), or None.
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
    allowed = allowed | (k == q)
    return allowed[:, None]


def causal_mask(query_len, offset, window=None, chunk=None):
    """Mask for a forward pass without a cache: keys are the queries themselves."""
    return attention_mask(mx.arange(query_len), 0, query_len, offset, window, chunk)


def masks_for_layers(caches, windows, query_len, offset, chunks=None):
    """One mask per layer, each built once per distinct (cache layout, window, chunk).

    ``caches`` is the per-layer cache list (or None), ``windows`` the per-layer
    sliding window (None for global layers), ``chunks`` the per-layer attention
    chunk (None for unchunked layers; ``chunks=None``: no layer is chunked). Layers
    that share a cache layout, a window and a chunk share the same mask array.
    """
    chunks = chunks if chunks is not None else [None] * len(windows)
    built = {}
    masks = []
    for i, (window, chunk) in enumerate(zip(windows, chunks)):
        cache = None if caches is None else caches[i]
        if cache is None:
            key = ("none", window, chunk)
            if key not in built:
                built[key] = causal_mask(query_len, offset, window, chunk)
        else:
            window = cache.effective_window(window)
            key = (cache.layout_key(), window, chunk)
            if key not in built:
                built[key] = attention_mask(
                    cache.key_slots(query_len), cache.size, query_len, offset, window, chunk
                )
        masks.append(built[key])
    return masks
