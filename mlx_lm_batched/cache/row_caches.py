"""One row's prompt cache in and out of a batch's caches.

A row's cache handed to or returned by the scheduler is a list of one-row layer
caches holding exactly that row's tokens (no padding), like a cache made by
``generate_step`` for the prompt alone, so it can be saved, reused as a prompt
cache, or inserted again. Everything that knows the inside of a batch's caches
(slot frame, padding, ring layout) is in the small functions here.
"""

import copy

import mlx.core as mx

from . import row_blocks
from .kv import KVCache
from .protocol import LayerCache
from .quantized import QuantizedKVCache
from .rotating import RotatingKVCache
from .state import StateCache


def check_cache(cache, name):
    """Raise ``TypeError`` unless ``cache`` is a list of this package's layer caches."""
    if not isinstance(cache, (list, tuple)) or not all(isinstance(c, LayerCache) for c in cache):
        raise TypeError(
            f"{name} must be a prompt cache from mlx_lm_batched (make_prompt_cache, "
            f"extract_cache or a finished Response), got {type(cache).__name__}"
        )


def cache_length(cache):
    """Tokens held by a one-row prompt cache (0 when empty or None)."""
    if not cache:
        return 0
    c = cache[0]
    return 0 if c.empty() else int(c.size)


def trim_to(cache, tokens):
    """Drop a one-row cache's slots past its first ``tokens`` (a trimmable cache)."""
    extra = cache_length(cache) - tokens
    if extra > 0:
        for c in cache:
            c.trim(extra)


def cache_nbytes(cache):
    """Bytes of the arrays of a list of layer caches."""
    return sum(getattr(c, "nbytes", 0) for c in cache or ())


def copy_cache(cache):
    """A copy of ``cache`` whose updates never reach the caller's arrays.

    A batch writes into its caches in place (slice assignment); the caller may keep
    using the cache it passed (a prompt-cache store), so the scheduler works on copies.
    """
    out = []
    for c in cache:
        new = copy.copy(c)
        if type(c) is KVCache and row_blocks.has_heads(c.blocks):
            # A shared head is never written (its slots are below the cache's size): the
            # copy shares it and copies only the row's own buffers.
            new.blocks = [b.moved(b.start, b.first) for b in c.blocks]
            for b in new.blocks:
                b.keys, b.values = mx.array(b.keys), mx.array(b.values)
            out.append(new)
            continue
        state = c.state
        new.state = [mx.array(x) for x in state] if state else []
        new.size = c.size if state else 0
        out.append(new)
    return out


def _empty_like(c):
    if isinstance(c, StateCache):
        return type(c)(len(c))  # keeps a subclass (RaggedStateCache)
    if isinstance(c, QuantizedKVCache):
        return QuantizedKVCache(c.group_size, c.bits, c.max_size)
    if isinstance(c, RotatingKVCache):
        return RotatingKVCache(c.max_size, c.keep)
    return KVCache()


def _row_of_full(c, row, pad, views):
    block = next((b for b in c.blocks or () if b.start <= row < b.stop), None)
    keep = (lambda x: x) if views else mx.contiguous
    if block is not None and block.head and block.first == pad:
        # A row continued from stored blocks keeps them as its shared head (no join):
        # only its own slots are copied.
        own = c.size - block.own_first
        new = KVCache()
        new.blocks = [row_blocks.with_head(
            *block.head, keep(block.keys[..., :own, :]), keep(block.values[..., :own, :]))]
        new.size = c.size - pad
        return new
    k, v = c.row_slots(row, pad)
    new = KVCache()
    if views or (block is not None and block.rows == 1 and not block.head
                 and block.first == pad):
        # The row's own buffer, held as it is rather than copied (a finished row's
        # cache, stored into the prefix cache block by block, was copied twice: one
        # more transient copy of its whole cache). MLX writes no buffer in place that
        # another array still holds, so the view keeps these values whatever the batch
        # does next; it holds at most RESERVE_AHEAD slots more than the row's.
        new.state = [k, v]
    else:
        new.state = [mx.contiguous(k), mx.contiguous(v)]
    return new


def _row_of_rotating(c, row, pad):
    M, n = c.max_size, c.size - pad
    keep = min(n, M)  # the ring's last slots that are this row's tokens
    keys, values = (x[row : row + 1, :, x.shape[2] - keep :] for x in c.ordered())
    new = RotatingKVCache(M, c.keep)
    new.load_ordered(mx.contiguous(keys), mx.contiguous(values), n)
    if c.keep:  # sinks are by position: the row's own, whatever its padding
        new.sink_keys = mx.contiguous(c.sink_keys[row : row + 1])
        new.sink_values = mx.contiguous(c.sink_values[row : row + 1])
    return new


def _row_of_quantized(c, row, pad):
    n = c.size - pad
    keys, values = c.ordered()
    keep = min(n, keys[0].shape[2])  # the held slots that are this row's tokens
    cut = lambda t: [mx.contiguous(x[row : row + 1, :, x.shape[2] - keep :]) for x in t]
    new = _empty_like(c)
    new.load_ordered(cut(keys), cut(values), n)
    return new


def _row_of_state(c, row, pad):
    # Padding never entered the state: the row's arrays are its state alone.
    new = type(c)(len(c))
    if not c.empty() and c.size - pad > 0:
        new.arrays = [mx.contiguous(a[row : row + 1]) for a in c.arrays]
        new.size = c.size - pad
    return new


def extract_row(caches, row, pad, views=False):
    """Row ``row`` of a batch's layer caches as a one-row cache without padding.

    ``pad`` is the row's left padding in the batch's slot frame (slots minus the
    row's real tokens). ``views``: a full attention layer's slots are slices of the
    batch's buffers, not copies, for a caller that reads them and lets them go before
    the batch's next step (a buffer another array still holds is copied whole at its
    next write instead of written in place: correct, but a transient copy of the block).
    """
    out = []
    for c in caches:
        if isinstance(c, StateCache):
            out.append(_row_of_state(c, row, pad))
        elif c.empty() or c.size - pad <= 0:
            out.append(_empty_like(c))
        elif isinstance(c, QuantizedKVCache):
            out.append(_row_of_quantized(c, row, pad))
        elif isinstance(c, RotatingKVCache):
            out.append(_row_of_rotating(c, row, pad))
        elif isinstance(c, KVCache):
            out.append(_row_of_full(c, row, pad, views))
        else:
            raise TypeError(f"cannot extract a row from a {type(c).__name__} cache")
    return out
