"""Key/value caches of one attention layer for a batch of left-padded rows.

All rows of a batch share one slot frame (see ``masks.py``): a layer cache stores keys
and values per slot; each row's padding lives with the batch (``PromptCache``), never
here. Each cache says which slots the keys it returns hold (``key_slots``), which is
all the mask needs.

- ``KVCache`` keeps every slot. Its buffers grow in chunks: at most ``RESERVE_AHEAD``
  slots past what is needed (fewer when the driver expects fewer, see ``reserve``), so
  memory follows what is generated and decoding does not copy the cache every token.
- ``RotatingKVCache`` (``rotating.py``) keeps the last ``max_size`` slots in a ring.

Both support removing rows (``filter``), appending rows of another cache (``extend``)
and appending a chunk whose rows start at different columns (``update_shifted``).
"""

import mlx.core as mx

from .protocol import FullSlotFrame

# Slots a cache allocates beyond those needed when the driver expects more: bounded,
# so a huge ``max_tokens`` reserves nothing it has not generated yet, and large enough
# that growing (one copy of the cache) happens once per this many decode steps; each
# decode step reads the whole cache anyway, so the copies cost well under 1%.
RESERVE_AHEAD = 256


def pad_left(x, n):
    """Prepend ``n`` zero slots on the sequence axis (axis 2)."""
    if n == 0 or x is None:
        return x
    pad = mx.zeros((*x.shape[:2], n, x.shape[3]), dtype=x.dtype)
    return mx.concatenate([pad, x], axis=2)


def shift_rows(old, new, shift):
    """Time-ordered ``old`` slots then ``new`` columns, with row ``b``'s first
    ``shift[b]`` new columns (its padding) moved before its old slots.

    Row ``b`` reads ``[pad x shift[b], old, new[shift[b]:]]``: its cached tokens and
    its new ones stay contiguous, the padding joins the row's leading padding.
    """
    if old is None:
        return new
    n, total = old.shape[2], old.shape[2] + new.shape[2]
    j = mx.arange(total)[None, :]
    d = shift[:, None]
    idx = mx.where(j < d, n + j, mx.where(j < n + d, j - d, j))
    return mx.take_along_axis(mx.concatenate([old, new], axis=2), idx[:, None, :, None], axis=2)


def update_kv(cache, keys, values, offset):
    """``cache.update_and_fetch(keys, values)``, handing it the rows' ``offset`` when it
    needs them (a ``RotatingKVCache`` that keeps sinks finds each row's by position)."""
    if getattr(cache, "wants_offset", False):
        return cache.update_and_fetch(keys, values, offset=offset)
    return cache.update_and_fetch(keys, values)


class KVCache(FullSlotFrame):
    """Cache of every slot, for global attention layers (a :class:`KVLayerCache`)."""

    step = 256

    def __init__(self):
        self.keys = None
        self.values = None
        self.size = 0
        self.expected = 0  # slots the driver expects this cache to reach (``reserve``)

    @property
    def offset(self):
        """Slots held (mlx-lm compatibility; models never read it)."""
        return self.size

    def reserve(self, slots):
        """Expect about ``slots`` slots in all (prompt + tokens to generate).

        Allocations then take up to ``slots`` (never more than ``RESERVE_AHEAD`` past
        what is needed), so a short generation fits its first allocation exactly and
        a long one grows in bounded chunks as it goes."""
        self.expected = max(0, int(slots))

    def reset(self):
        """Forget every slot and free the buffers."""
        self.keys = self.values = None
        self.size = 0

    def _capacity(self, needed):
        if self.expected >= needed:
            return min(self.expected, needed + RESERVE_AHEAD)
        return -(-needed // self.step) * self.step

    def allocate(self, needed, keys, values, batch=None):
        """Make room for ``needed`` slots in buffers shaped like ``keys``/``values``
        (``batch`` rows, default theirs), keeping the slots already held."""
        if self.keys is not None and needed <= self.keys.shape[2]:
            return
        capacity = self._capacity(needed)
        B, H, _, Dk = keys.shape
        B = B if batch is None else batch
        new_k = mx.zeros((B, H, capacity, Dk), keys.dtype)
        new_v = mx.zeros((B, H, capacity, values.shape[3]), values.dtype)
        if self.keys is not None and self.size > 0:
            new_k[..., : self.size, :] = self.keys[..., : self.size, :]
            new_v[..., : self.size, :] = self.values[..., : self.size, :]
        self.keys, self.values = new_k, new_v

    def update_and_fetch(self, keys, values):
        """Append ``(B, H, L, D)`` keys/values; return all cached keys/values."""
        end = self.size + keys.shape[2]
        self.allocate(end, keys, values)
        self.keys[..., self.size : end, :] = keys
        self.values[..., self.size : end, :] = values
        self.size = end
        return self.keys[..., :end, :], self.values[..., :end, :]

    def ordered(self):
        """Cached ``(keys, values)`` in slot order, or ``(None, None)``."""
        if self.keys is None:
            return None, None
        return self.keys[..., : self.size, :], self.values[..., : self.size, :]

    def load_ordered(self, keys, values, size):
        """Hold ``keys``/``values``: the slots up to slot ``size`` (exclusive) in order."""
        self.keys, self.values, self.size = keys, values, size

    def update_shifted(self, keys, values, shift):
        """Like ``update_and_fetch`` for a chunk whose first ``shift[b]`` columns are
        padding of row ``b``: they go before the row's cached slots (its padding
        grows by ``shift[b]``), so the row stays contiguous. Copies the cache once."""
        old_k, old_v = self.ordered()
        keys = shift_rows(old_k, keys, shift)
        values = shift_rows(old_v, values, shift)
        self.size = 0
        return self.update_and_fetch(keys, values)

    def empty(self):
        """True before the first write (mlx-lm's cache API)."""
        return self.keys is None

    @property
    def batch_size(self):
        return 0 if self.keys is None else self.keys.shape[0]

    @property
    def state(self):
        """The cached slots' ``[keys, values]`` in slot order (empty when none)."""
        if self.keys is None:
            return []
        return [self.keys[..., : self.size, :], self.values[..., : self.size, :]]

    @state.setter
    def state(self, value):
        if not value:
            self.reset()
            return
        self.keys, self.values = value
        self.size = self.keys.shape[2]

    def is_trimmable(self):
        return True

    def trim(self, n):
        """Drop the last ``n`` slots; returns how many were dropped."""
        n = min(self.size, n)
        self.size -= n
        return n

    def filter(self, rows):
        """Keep only ``rows`` (indices into the batch axis)."""
        if self.keys is not None:
            rows = mx.array(rows)
            self.keys = self.keys[rows]
            self.values = self.values[rows]

    def drop_leading(self, n):
        """Drop the first ``n`` slots (padding every row shares)."""
        if n <= 0 or self.keys is None:
            return
        self.keys = self.keys[..., n : self.size, :]
        self.values = self.values[..., n : self.size, :]
        self.size -= n

    def extend(self, other):
        """Append the rows of ``other`` to this batch.

        Returns ``(pad_self, pad_other)``: slots of left padding added to this
        cache's rows and to ``other``'s, which the batch adds to their padding.
        """
        size = max(self.size, other.size)
        pads = (size - self.size, size - other.size)
        parts = []
        for cache, pad in ((self, pads[0]), (other, pads[1])):
            if cache.keys is None:
                raise ValueError("cannot extend an empty cache: prefill both first")
            k, v = cache.state
            parts.append((pad_left(k, pad), pad_left(v, pad)))
        self.keys = mx.concatenate([parts[0][0], parts[1][0]], axis=0)
        self.values = mx.concatenate([parts[0][1], parts[1][1]], axis=0)
        self.size = size
        return pads

    @property
    def nbytes(self):
        if self.keys is None:
            return 0
        return self.keys.nbytes + self.values.nbytes
