"""mlx-lm's mask and attention functions (``mlx_lm.models.base``) for code that builds
its own attention: thin adapters over the one mask path (``masks.py``) and the shared
attention op (``attention.py``)."""

import mlx.core as mx

from ..layers.quantized_attention import quantization_of

from ..layers import masks as masks_lib
from ..layers.attention import scaled_dot_product_attention as _attention


def create_causal_mask(N, offset=0, window_size=None, right_padding=None, left_padding=None):
    """Boolean causal mask of ``N`` queries after ``offset`` cached tokens (mlx-lm's).

    ``(N, offset + N)``, or ``(B, 1, N, offset + N)`` with ``left_padding`` (``(B,)``
    padding slots per row). A padding query may attend its own slot (so it never gets
    NaN; see masks.py). ``right_padding`` raises ``NotImplementedError``: batches here
    are left-padded.
    """
    if right_padding is not None:
        raise NotImplementedError("right_padding is not supported: mlx_lm_batched batches are "
                                  "left-padded (pass left_padding)")
    pad = mx.zeros((1,), mx.int32) if left_padding is None else mx.array(left_padding, mx.int32)
    mask = masks_lib.attention_mask(mx.arange(offset + N), offset, N, offset - pad, window_size)
    return mask[0, 0] if left_padding is None else mask


def create_attention_mask(h, cache=None, window_size=None, return_array=False):
    """mlx-lm's mask for hidden states ``h`` ``(B, N, D)`` and one layer's ``cache``
    (its tokens come before the queries), with mlx-lm's cases: None for one query
    (unless a window and a cache); ``"causal"`` for several queries unless a window
    applies (with a cache, or cutting into the queries) or ``return_array``; else a
    boolean ``(N, S)`` array from the one mask path (``(B, 1, N, S)`` only when the
    cache's rows need different masks). A rotating cache answers for itself
    (``RotatingKVCache.make_mask``), as in mlx-lm."""
    N = h.shape[1]
    if cache is not None and getattr(cache, "max_size", None) is not None:
        # A ring (with or without sink tokens): which keys a query sees depends on the
        # ring's state (mlx-lm's rule), which only the cache knows. No package model
        # calls this function: it serves mlx-lm-style code, whose rows are unpadded.
        return cache.make_mask(N, window_size=window_size, return_array=return_array)
    before = 0 if cache is None else int(getattr(cache, "size", 0) or 0)
    if N == 1 and (window_size is None or cache is None):
        return None
    # As mlx-lm: a window gives an array whenever there is a cache (or it cuts in).
    windowed = window_size is not None and (cache is not None or N > window_size)
    if not windowed and not return_array:
        return "causal"
    if cache is None:
        return create_causal_mask(N, 0, window_size)
    offset = mx.full((h.shape[0],), before, mx.int32)
    mask = masks_lib.attention_mask(cache.key_slots(N), before, N, offset,
                                    cache.effective_window(window_size))
    if mask.shape[0] == 1 or bool(mx.all(mask == mask[:1])):
        return mask[0, 0]
    return mask


def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's attention entry point on the shared op: ``(B, H, L, D)`` queries,
    keys/values with as many or fewer heads (or quantized triples from a
    ``QuantizedKVCache``); ``mask`` None, ``"causal"`` or boolean."""
    L, K = queries.shape[2], (keys[0] if isinstance(keys, tuple) else keys).shape[2]
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or an array, got {mask!r}")
        mask = masks_lib.attention_mask(mx.arange(K), K - L, L,
                                        mx.full((queries.shape[0],), K - L, mx.int32))
    return _attention(queries, keys, values, scale, mask, sinks=sinks)


def quantized_scaled_dot_product_attention(queries, q_keys, q_values, scale, mask,
                                           group_size=64, bits=8):
    """mlx-lm's attention over quantized ``(packed, scales, biases)`` keys and values
    (``group_size``/``bits`` must be the triples' own)."""
    if quantization_of(queries, q_keys) != (group_size, bits):
        raise ValueError(f"keys are not quantized with group_size={group_size}, bits={bits}")
    return scaled_dot_product_attention(queries, tuple(q_keys), tuple(q_values), None, scale,
                                        mask)
