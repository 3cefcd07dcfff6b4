"""Per-row rewind of a left-padded batch's caches (speculative decoding).

After a verify step every row holds the same new slots, but row ``b`` keeps only the
first of them: its last ``drop[b]`` slots are rejected drafts. A left-padded batch keeps
each row contiguous and right-aligned in one slot frame (see ``masks.py``), so the batch
drops the ``min(drop)`` slots no row keeps, and row ``b`` moves right by
``drop[b] - min(drop)`` slots: its rejected slots vanish and the same number of slots
join its leading padding. The row's positions do not change (its ``offset`` is slots
minus padding), so the mask and RoPE see exactly the row alone.
"""

import mlx.core as mx

from .kv import KVCache
from .rotating import RotatingKVCache


def can_rewind_rows(cache):
    """True when a layer cache can drop a different number of last slots per row."""
    if type(cache) is RotatingKVCache:
        return cache.size <= cache.max_size
    return type(cache) is KVCache


def rewind_rows(cache, drop):
    """Drop row ``b``'s last ``drop[b]`` slots of one layer cache; returns the slots of
    left padding added per row (``drop[b] - min(drop)``).

    Raises ``ValueError`` for a cache that cannot (a recurrent state, or a
    sliding-window ring that has wrapped: the slots to restore are overwritten)."""
    if not can_rewind_rows(cache):
        raise ValueError(f"speculative decoding needs caches that can rewind each row; "
                         f"{type(cache).__name__} cannot (recurrent state, or a sliding "
                         f"window already full)")
    low = min(drop)
    shift = [d - low for d in drop]
    if cache.empty():  # a layer the model never wrote holds nothing to drop
        return shift
    if low:
        # The ring's own trim refuses once full; unwrapped, its slots are in order.
        KVCache.trim(cache, low)
    if not any(shift):
        return shift
    keys, values = cache.ordered()
    size = keys.shape[2]
    cache.load_ordered(_shift_right(keys, shift, size), _shift_right(values, shift, size),
                       cache.size)
    return shift


def _shift_right(x, shift, size):
    """Row ``b`` of ``x`` (``(B, H, size, D)``) moved ``shift[b]`` slots right; the slots
    it leaves are new padding (they copy the first slots, masked like every pad slot).
    One contiguous copy per distinct shift (at most ``K + 1``): a gather per element is
    an order of magnitude slower on the CPU."""
    out = x
    for s in sorted(set(shift) - {0}):
        moved = mx.concatenate([x[..., :s, :], x[..., : size - s, :]], axis=2)
        rows = mx.array([d == s for d in shift])[:, None, None, None]
        out = mx.where(rows, moved, out)
    return out
