"""The ring cache of a sliding-window (or ``max_kv_size``-bounded) attention layer.

``RotatingKVCache`` keeps the last ``max_size`` slots in a ring where slot ``p`` lives at
index ``p % max_size``. It is exact with left padding (the mask hides pad slots per row),
with prompts longer than the window, and with chunked prefill (a chunk sees the
``max_size - 1`` cached slots before it, so every query sees exactly its window whatever
the chunking). With ``keep`` it also keeps each row's first ``keep`` real tokens (mlx-lm's
"attention sinks", ``sinks.py``), found by position, whatever the row's padding.
"""

import mlx.core as mx

from .kv import KVCache, pad_left, shift_rows
from .sinks import capture_sinks, sink_ring_mask


class RotatingKVCache(KVCache):
    """Cache of the last ``max_size`` slots, for sliding-window layers and ``max_kv_size``.

    ``keep``: also keep each row's first ``keep`` tokens (attention sinks, mlx-lm's
    ``max_kv_size`` caches keep 4; see ``sinks.py``): the keys returned are then the
    sinks followed by the ring's, and ``update_and_fetch`` takes each row's ``offset``
    (without it, rows are taken as unpadded, as in mlx-lm)."""

    def __init__(self, max_size, keep=0):
        super().__init__()
        if max_size < 1:
            raise ValueError(f"max_size must be positive, got {max_size}")
        if not 0 <= keep < max_size:
            raise ValueError(f"keep must be in [0, max_size={max_size}), got {keep}")
        self.max_size = max_size
        self.keep = keep
        self.sink_keys = self.sink_values = None  # (B, H, keep, D) when keep > 0

    @property
    def wants_offset(self):
        """True when ``update_and_fetch`` needs the rows' ``offset`` (sinks kept)."""
        return self.keep > 0

    def reset(self):
        super().reset()
        self.sink_keys = self.sink_values = None

    def _capture(self, keys, values, offset):
        """Keep the sinks among the new columns (positions from ``offset``, or the
        slots when None: unpadded rows)."""
        if offset is None:
            offset = mx.full((keys.shape[0],), self.size, mx.int32)
        self.sink_keys = capture_sinks(self.sink_keys, keys, offset, self.keep)
        self.sink_values = capture_sinks(self.sink_values, values, offset, self.keep)

    def _with_sinks(self, kv):
        if not self.keep:
            return kv
        return (mx.concatenate([self.sink_keys, kv[0]], axis=2),
                mx.concatenate([self.sink_values, kv[1]], axis=2))

    def make_mask(self, N, window_size=None, return_array=False):
        """mlx-lm's mask for ``N`` queries of unpadded rows about to be written: None
        or ``"causal"`` when no mask is needed (never with sinks), else a boolean
        ``(N, K)`` array over the keys ``update_and_fetch`` will return."""
        window = self.max_size if window_size is None else window_size
        before = min(self.max_size - 1, self.size)
        if not return_array and not self.keep:
            if N == 1 and window >= self.max_size:
                return None
            if N > 1 and before + N <= window:
                return "causal"
        offset = mx.array([self.size], mx.int32)
        mask = sink_ring_mask(self.key_slots(N), self.size, N, offset, self.max_size,
                              self.keep, window if window < self.max_size else None)
        return mask[0, 0]

    def _capacity(self, needed):
        return min(super()._capacity(needed), self.max_size)

    def ordered(self):
        """The cached slots in time order: ``(keys, values)`` of the last min(size, max)."""
        if self.keys is None:
            return None, None
        M, S = self.max_size, self.size
        if S <= M:
            return self.keys[..., :S, :], self.values[..., :S, :]
        start = S % M
        order = lambda x: mx.concatenate([x[..., start:, :], x[..., :start, :]], axis=2)
        return order(self.keys), order(self.values)

    def load_ordered(self, keys, values, size):
        """Hold time-ordered ``keys``/``values``, the last of them at slot ``size - 1``."""
        self.size = size
        self._store_ring(keys, values, size)

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

    def update_and_fetch(self, keys, values, offset=None):
        """Append ``(B, H, L, D)`` keys/values; return the keys/values to attend (the
        sinks first when ``keep``). ``offset``: ``(B,)`` position of each row's first
        column, used to find the sinks."""
        if self.keep:
            self._capture(keys, values, offset)
        return self._with_sinks(self._ring_update(keys, values))

    def _ring_update(self, keys, values):
        M, S, L = self.max_size, self.size, keys.shape[2]
        if S + L <= M:
            self.allocate(S + L, keys, values)
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
        old_k, old_v = self.ordered()
        return self._append_ordered(old_k, old_v, keys, values)

    def _append_ordered(self, old_k, old_v, keys, values):
        """Append a chunk after the time-ordered cached slots ``old``: return the
        ``max_size - 1`` slots before it plus the chunk (so each query sees its whole
        window), keep the last ``max_size``."""
        M, S, L = self.max_size, self.size, keys.shape[2]
        keep = min(S, M - 1)
        if keep and old_k is not None:
            keys = mx.concatenate([old_k[..., -keep:, :], keys], axis=2)
            values = mx.concatenate([old_v[..., -keep:, :], values], axis=2)
        self.size = S + L
        self._store_ring(keys, values, self.size)
        return keys, values

    def update_shifted(self, keys, values, shift, offset=None):
        if self.keep:
            self._capture(keys, values, offset)
        old_k, old_v = self.ordered()
        M, S, L = self.max_size, self.size, keys.shape[2]
        keys = shift_rows(old_k, keys, shift)
        values = shift_rows(old_v, values, shift)
        if S + L <= M:
            KVCache.reset(self)  # the ring only: the sinks stay
            return self._with_sinks(self._ring_update(keys, values))
        # The first n = min(S, max_size) shifted slots are the (moved) old ones.
        n = keys.shape[2] - L
        return self._with_sinks(self._append_ordered(keys[..., :n, :], values[..., :n, :],
                                                     keys[..., n:, :], values[..., n:, :]))

    def key_slots(self, query_len):
        M, S, L = self.max_size, self.size, query_len
        if S + L <= M:
            return mx.arange(S + L)
        if L == 1 and S >= M:
            r = mx.arange(M)
            return r + M * ((S - r) // M)
        return mx.arange(S - min(S, M - 1), S + L)

    def keys_in_slot_order(self, query_len):
        # Every case of key_slots but a decode step over a full ring is a range ending
        # at the last query's slot; sinks (keep) come first, out of that order.
        return not self.keep and (query_len > 1 or self.size + query_len <= self.max_size)

    def effective_window(self, window):
        return self.max_size if window is None else min(window, self.max_size)

    def layout_key(self):
        return ("ring", self.max_size, self.size, self.keep)

    @property
    def state(self):
        """``[keys, values]`` of the ring (the sinks first when ``keep``, as mlx-lm's)."""
        if self.keys is None:
            return []
        kv = (self.keys, self.values)
        if self.size < self.max_size:
            kv = (self.keys[..., : self.size, :], self.values[..., : self.size, :])
        return list(self._with_sinks(kv))

    @state.setter
    def state(self, value):
        if not value:
            self.keys = self.values = self.sink_keys = self.sink_values = None
            return
        keys, values = value
        if self.keep:
            self.sink_keys, self.sink_values = keys[..., : self.keep, :], values[..., : self.keep, :]
            keys, values = keys[..., self.keep :, :], values[..., self.keep :, :]
        self.keys, self.values = keys, values

    def filter(self, rows):
        super().filter(rows)
        if self.sink_keys is not None:
            rows = mx.array(rows)
            self.sink_keys, self.sink_values = self.sink_keys[rows], self.sink_values[rows]

    @property
    def nbytes(self):
        sinks = 0 if self.sink_keys is None else self.sink_keys.nbytes + self.sink_values.nbytes
        return super().nbytes + sinks

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
            k, v = cache.ordered()
            # Slots before this cache's first one become padding of its rows.
            pad = keep - k.shape[2]
            parts.append((pad_left(k, pad), pad_left(v, pad)))
        keys = mx.concatenate([parts[0][0], parts[1][0]], axis=0)
        values = mx.concatenate([parts[0][1], parts[1][1]], axis=0)
        pads = (size - self.size, size - other.size)
        if self.keep != other.keep:
            raise ValueError("cannot merge rotating caches that keep different sink counts")
        if self.keep:  # sinks are per row and by position: padding does not move them
            self.sink_keys = mx.concatenate([self.sink_keys, other.sink_keys], axis=0)
            self.sink_values = mx.concatenate([self.sink_values, other.sink_values], axis=0)
        self.size = size
        self._store_ring(keys, values, size)
        return pads


# mlx-lm's ``make_prompt_cache(model, max_kv_size=N)`` keeps 4 sink tokens per row.
MAX_KV_SINKS = 4


def max_kv_cache(max_kv_size):
    """The cache of a global attention layer bounded by ``max_kv_size`` (mlx-lm's: a ring
    of that many slots that keeps each row's first ``MAX_KV_SINKS`` tokens)."""
    return RotatingKVCache(max_kv_size, keep=min(MAX_KV_SINKS, max_kv_size - 1))
