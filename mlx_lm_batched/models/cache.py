"""Key/value caches for batches of left-padded rows.

All rows of a batch share one slot frame (see ``masks.py``): a cache stores keys and
values only, never positions or padding; the batch driver owns those. Each cache says
which slots the keys it returns hold (``key_slots``), which is all the mask needs.

- ``KVCache`` keeps every slot, growing its buffers in chunks of ``step`` slots so
  decoding does not copy the whole cache each token.
- ``RotatingKVCache`` keeps the last ``max_size`` slots in a ring where slot ``p`` lives
  at index ``p % max_size``. It is exact with left padding (the mask hides pad slots
  per row), with prompts longer than the window, and with chunked prefill (a chunk
  sees the ``max_size - 1`` cached slots before it, so every query sees exactly its
  window whatever the chunking).

Both support removing rows (``filter``) and appending rows of another cache
(``extend``), the building blocks of continuous batching.
"""

import mlx.core as mx


def _pad_left(x, n):
    """Prepend ``n`` zero slots on the sequence axis (axis 2)."""
    if n == 0 or x is None:
        return x
    pad = mx.zeros((*x.shape[:2], n, x.shape[3]), dtype=x.dtype)
    return mx.concatenate([pad, x], axis=2)


class KVCache:
    """Cache of every slot, for global attention layers."""

    step = 256
    # Slots the batch driver expects this cache to hold (prompt + new tokens): the
    # first allocation that fits takes exactly that, so decoding neither copies the
    # cache to grow it nor holds up to ``step - 1`` unused slots per row.
    capacity_hint = 0
    row_groups = None  # set per decode step by BatchEngine (grouped attention)

    def __init__(self):
        self.keys = None
        self.values = None
        self.size = 0

    @property
    def offset(self):
        """Slots held (mlx-lm compatibility; models never read it)."""
        return self.size

    def _grow(self, keys, values, needed, batch=None):
        if self.capacity_hint >= needed:
            capacity = self.capacity_hint
        else:
            capacity = ((needed + self.step - 1) // self.step) * self.step
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
        if self.keys is None or end > self.keys.shape[2]:
            self._grow(keys, values, end)
        self.keys[..., self.size : end, :] = keys
        self.values[..., self.size : end, :] = values
        self.size = end
        return self.keys[..., :end, :], self.values[..., :end, :]

    def key_slots(self, query_len):
        return mx.arange(self.size + query_len)

    def effective_window(self, window):
        return window

    def layout_key(self):
        return ("full", self.size)

    def empty(self):
        return self.keys is None

    @property
    def batch_size(self):
        return 0 if self.keys is None else self.keys.shape[0]

    @property
    def state(self):
        if self.keys is None:
            return []
        return [self.keys[..., : self.size, :], self.values[..., : self.size, :]]

    @state.setter
    def state(self, value):
        if not value:
            self.keys = self.values = None
            self.size = 0
            return
        self.keys, self.values = value
        self.size = self.keys.shape[2]

    @property
    def meta_state(self):
        return ""

    @meta_state.setter
    def meta_state(self, value):
        pass

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
        cache's rows and to ``other``'s, which the driver adds to their padding.
        """
        size = max(self.size, other.size)
        pads = (size - self.size, size - other.size)
        parts = []
        for cache, pad in ((self, pads[0]), (other, pads[1])):
            if cache.keys is None:
                parts.append(None)
            else:
                k, v = cache.state
                parts.append((_pad_left(k, pad), _pad_left(v, pad)))
        if parts[0] is None or parts[1] is None:
            raise ValueError("cannot extend an empty cache: prefill both first")
        self.keys = mx.concatenate([parts[0][0], parts[1][0]], axis=0)
        self.values = mx.concatenate([parts[0][1], parts[1][1]], axis=0)
        self.size = size
        return pads

    @property
    def nbytes(self):
        if self.keys is None:
            return 0
        return self.keys.nbytes + self.values.nbytes

    def rows_view(self, start, stop, first_slot, batch_size):
        """A :class:`RowsView` of rows ``[start, stop)`` from slot ``first_slot`` on."""
        return RowsView(self, start, stop, first_slot, batch_size)


class RowsView:
    """Rows ``[start, stop)`` of an empty ``KVCache`` of ``batch_size`` rows, seen from
    slot ``first_slot`` on: the cache of a sub-batch prefilled on its own.

    ``BatchEngine`` prefills rows of similar length together so that short rows skip
    the leading columns that are padding for all of them; each group writes its keys
    straight into the shared buffers at its rows and slots. To the model and the mask
    the view is an ordinary cache whose slot 0 is the parent's ``first_slot``; the
    parent's slots before it stay zero and are padding of those rows.
    """

    def __init__(self, parent, start, stop, first_slot, batch_size):
        self.parent, self.start, self.stop = parent, start, stop
        self.first, self.batch_size = first_slot, batch_size
        self.size = 0

    def update_and_fetch(self, keys, values):
        p = self.parent
        begin, end = self.first + self.size, self.first + self.size + keys.shape[2]
        if p.keys is None:
            p._grow(keys, values, end, batch=self.batch_size)  # sized by capacity_hint
        elif end > p.keys.shape[2]:
            raise ValueError("a RowsView cannot grow its parent: set capacity_hint first")
        rows = slice(self.start, self.stop)
        p.keys[rows, :, begin:end, :] = keys
        p.values[rows, :, begin:end, :] = values
        self.size += keys.shape[2]
        return p.keys[rows, :, self.first : end, :], p.values[rows, :, self.first : end, :]

    def key_slots(self, query_len):
        return mx.arange(self.size + query_len)

    def effective_window(self, window):
        return window

    def layout_key(self):
        return ("full", self.size)

    @property
    def state(self):
        # The whole buffers: evaluating them runs this group's writes.
        return [self.parent.keys, self.parent.values]


class RotatingKVCache(KVCache):
    """Cache of the last ``max_size`` slots, for sliding-window layers and ``max_kv_size``."""

    def __init__(self, max_size, keep=0):
        super().__init__()
        if keep:
            raise ValueError(
                "RotatingKVCache(keep>0) is not supported: batched rows keep no attention sink"
            )
        if max_size < 1:
            raise ValueError(f"max_size must be positive, got {max_size}")
        self.max_size = max_size
        self.keep = 0

    def _temporal(self):
        """The cached slots in time order: ``(keys, values)`` of the last min(size, max) slots."""
        M, S = self.max_size, self.size
        if S <= M:
            return self.keys[..., :S, :], self.values[..., :S, :]
        start = S % M
        order = lambda x: mx.concatenate([x[..., start:, :], x[..., :start, :]], axis=2)
        return order(self.keys), order(self.values)

    def _store_ring(self, keys, values, end):
        """Store time-ordered ``keys`` ending at slot ``end`` in ring layout."""
        M = self.max_size
        if end <= M:
            self.keys, self.values = keys, values
            return
        keys, values = keys[..., -M:, :], values[..., -M:, :]
        c = end % M
        if c:
            keys = mx.concatenate([keys[..., M - c :, :], keys[..., : M - c, :]], axis=2)
            values = mx.concatenate([values[..., M - c :, :], values[..., : M - c, :]], axis=2)
        self.keys, self.values = keys, values

    def update_and_fetch(self, keys, values):
        M, S, L = self.max_size, self.size, keys.shape[2]
        if S + L <= M:
            if self.keys is None or S + L > self.keys.shape[2]:
                self._grow(keys, values, min(S + L, M))
            self.keys[..., S : S + L, :] = keys
            self.values[..., S : S + L, :] = values
            self.size = S + L
            return self.keys[..., : S + L, :], self.values[..., : S + L, :]
        if L == 1 and S >= M:
            i = S % M
            self.keys[..., i : i + 1, :] = keys
            self.values[..., i : i + 1, :] = values
            self.size = S + 1
            return self.keys, self.values
        # A chunk that overflows the ring: return the max_size - 1 slots before it
        # plus the chunk, so each query sees its whole window; keep the last max_size.
        old_k, old_v = self._temporal() if self.keys is not None else (None, None)
        keep = min(S, M - 1)
        if keep and old_k is not None:
            keys = mx.concatenate([old_k[..., -keep:, :], keys], axis=2)
            values = mx.concatenate([old_v[..., -keep:, :], values], axis=2)
        self.size = S + L
        self._store_ring(keys, values, self.size)
        return keys, values

    def _grow(self, keys, values, needed):
        # Grow in chunks but never past the ring size.
        capacity = min(((needed + self.step - 1) // self.step) * self.step, self.max_size)
        B, H, _, Dk = keys.shape
        new_k = mx.zeros((B, H, capacity, Dk), keys.dtype)
        new_v = mx.zeros((B, H, capacity, values.shape[3]), values.dtype)
        if self.keys is not None and self.size > 0:
            new_k[..., : self.size, :] = self.keys[..., : self.size, :]
            new_v[..., : self.size, :] = self.values[..., : self.size, :]
        self.keys, self.values = new_k, new_v

    def key_slots(self, query_len):
        M, S, L = self.max_size, self.size, query_len
        if S + L <= M:
            return mx.arange(S + L)
        if L == 1 and S >= M:
            r = mx.arange(M)
            return r + M * ((S - r) // M)
        return mx.arange(S - min(S, M - 1), S + L)

    def effective_window(self, window):
        return self.max_size if window is None else min(window, self.max_size)

    def layout_key(self):
        return ("ring", self.max_size, self.size)

    @property
    def state(self):
        if self.keys is None:
            return []
        if self.size < self.max_size:
            return [self.keys[..., : self.size, :], self.values[..., : self.size, :]]
        return [self.keys, self.values]

    @state.setter
    def state(self, value):
        if not value:
            self.keys = self.values = None
            return
        self.keys, self.values = value

    @property
    def meta_state(self):
        return tuple(map(str, (self.keep, self.max_size, self.size)))

    @meta_state.setter
    def meta_state(self, value):
        self.keep, self.max_size, self.size = map(int, value)

    def is_trimmable(self):
        return self.size < self.max_size

    def trim(self, n):
        if not self.is_trimmable():
            return 0
        return super().trim(n)

    def drop_leading(self, n):
        if n <= 0 or self.keys is None or self.size > self.max_size:
            return  # once wrapped, leading slots are already gone from the ring
        super().drop_leading(n)

    def extend(self, other):
        M = self.max_size
        if other.max_size != M:
            raise ValueError("cannot merge rotating caches of different sizes")
        size = max(self.size, other.size)
        keep = min(size, M)
        parts = []
        for cache in (self, other):
            if cache.keys is None:
                raise ValueError("cannot extend an empty cache: prefill both first")
            k, v = cache._temporal()
            # Slots before this cache's first one become padding of its rows.
            pad = keep - k.shape[2]
            parts.append((_pad_left(k, pad), _pad_left(v, pad)))
        keys = mx.concatenate([parts[0][0], parts[1][0]], axis=0)
        values = mx.concatenate([parts[0][1], parts[1][1]], axis=0)
        pads = (size - self.size, size - other.size)
        self.size = size
        self._store_ring(keys, values, size)
        return pads


def make_prompt_cache(model, max_kv_size=None):
    """One cache per layer: the model's own layout when it has one, else full caches
    (or rotating caches of ``max_kv_size`` slots when given)."""
    if hasattr(model, "make_cache"):
        try:
            return model.make_cache(max_kv_size=max_kv_size)
        except TypeError:
            return model.make_cache()
    n = len(model.layers)
    if max_kv_size is not None:
        return [RotatingKVCache(max_size=max_kv_size) for _ in range(n)]
    return [KVCache() for _ in range(n)]


# Saving, loading and trimming whole prompt caches (mlx-lm's names live here too).
from .prompt_cache import (  # noqa: E402,F401
    can_trim_prompt_cache,
    load_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
