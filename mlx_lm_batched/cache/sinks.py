"""Attention sinks of a ``RotatingKVCache(max_size, keep=k)``: each row's first ``keep``
real tokens, kept beside the ring once it has moved past them (mlx-lm's ``max_kv_size``
caches keep 4).

A batch's rows start at different slots (left padding), so a row's sinks are found by
its positions (``offset``, passed down with the keys), never by slot: each row keeps
its own first ``keep`` tokens whatever its padding.

Which keys a query sees is mlx-lm 0.32's rule, so results equal mlx-lm's (see
:func:`sink_visible`); it depends on how the queries were fed, as mlx-lm's does: a
prompt is fed as mlx-lm feeds it (chunks of ``prefill_step_size`` columns, then the
last column alone), which ``engine/prefill.py`` does.
"""

import mlx.core as mx


def capture_sinks(sinks, keys, offset, keep):
    """``sinks`` ``(B, H, keep, D)`` (or None) with the columns of ``keys`` ``(B, H, L, D)``
    that hold positions ``< keep`` written in; ``offset`` ``(B,)`` is the position of each
    row's first column (negative for padding columns)."""
    B, H, L, D = keys.shape
    if sinks is None:
        sinks = mx.zeros((B, H, keep, D), dtype=keys.dtype)
    col = mx.arange(keep)[None, :] - offset.astype(mx.int32)[:, None]  # (B, keep)
    inside = (col >= 0) & (col < L)
    taken = mx.take_along_axis(keys, mx.clip(col, 0, L - 1)[:, None, :, None], axis=2)
    return mx.where(inside[:, None, :, None], taken.astype(sinks.dtype), sinks)


def sink_visible(query_pos, key_pos, first_pos, query_len, max_size, keep, window=None):
    """Boolean: may a query at position ``query_pos`` see the key at ``key_pos``
    (broadcastable int arrays; ``first_pos``: the row's first query position)?

    mlx-lm 0.32's ``RotatingKVCache(max_size, keep)`` rule, written per row:

    - one query per call (decode, a prompt's last token): the ``keep`` sinks and the
      last ``max_size - keep`` positions;
    - a chunk of several queries after fewer than ``max_size - 1`` tokens: a plain
      window of ``max_size``;
    - a chunk after ``n >= max_size - 1`` tokens: mlx-lm's cache then holds the sinks,
      the last ``max_size - 1 - keep`` tokens and the chunk, under a window mask that
      counts them as consecutive, so the chunk's query ``i`` sees sink ``p`` only when
      ``p >= i`` and the other keys from ``n - max_size + 1 + max(i, keep)`` on.

    With ``keep=0`` every case is the plain window of ``max_size``. ``window`` (a
    layer's own sliding window) also bounds the non-sink keys.
    """
    causal = (key_pos <= query_pos) & (key_pos >= 0)
    if query_len == 1:
        ok = (key_pos < keep) | (query_pos - key_pos < max_size - keep)
    else:
        n = mx.maximum(first_pos, 0)
        i = query_pos - n
        late = mx.where(key_pos < keep, key_pos >= i,
                        key_pos >= n - max_size + 1 + mx.maximum(i, keep))
        ok = mx.where(n < max_size - 1, query_pos - key_pos < max_size, late)
    if window is not None:
        ok = ok & ((key_pos < keep) | (query_pos - key_pos < window))
    return causal & ok


def sink_ring_mask(ring_slots, slots_before, query_len, offset, max_size, keep, window=None):
    """Boolean ``(B, 1, query_len, keep + K)`` mask over the keys a sink cache returns:
    its ``keep`` sinks, then the ring's ``K`` keys at slots ``ring_slots``.

    A row's first ``keep`` positions are always seen through the sink columns (captured
    as they are written, so they hold every fed one), never through the ring's copies:
    no key counts twice, and a ring loaded from a file need not hold them."""
    offset = offset if isinstance(offset, mx.array) else mx.array(offset)
    offset = offset.astype(mx.int32)
    pad = (slots_before - offset)[:, None, None]  # (B, 1, 1)
    q_slot = (slots_before + mx.arange(query_len))[None, :, None]  # (1, L, 1)
    q_pos = q_slot - pad
    first = offset[:, None, None]
    k_slot = ring_slots[None, None, :]
    k_pos = k_slot - pad
    ring = sink_visible(q_pos, k_pos, first, query_len, max_size, keep, window) & (k_pos >= keep)
    ring = ring | ((k_slot == q_slot) & (q_pos < 0))  # a padding query sees its own slot
    s_pos = mx.arange(keep)[None, None, :]
    sinks = sink_visible(q_pos, s_pos, first, query_len, max_size, keep, window)
    return mx.concatenate([sinks, ring], axis=2)[:, None]
