"""Quantized key/value caches: mlx-lm's ``QuantizedKVCache`` for batches of left-padded rows.

Keys and values are stored as ``mx.quantize`` triples ``(packed, scales, biases)``,
quantized along the head dimension, one slot of one row of one head at a time: a row's
quantized slots do not depend on the other rows, so batching stays exact.

Each part of the triple lives in its own float-cache instance (``KVCache``, or
``RotatingKVCache`` for sliding-window layers), driven in lockstep: the slot frame,
growth, rings, left padding, rows joining and leaving, shifted writes and trimming are
the float caches' own code, applied to three arrays instead of one. ``update_and_fetch``
returns the triples; the shared attention (``layers/attention.py``) attends over them
with ``mx.quantized_matmul``.
"""

import copy

import mlx.core as mx

from .compat import MlxLmCacheMethods
from .kv import KVCache
from .rotating import RotatingKVCache

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


def check_kv_quantization(bits, group_size):
    """Raise ``ValueError`` unless ``bits``/``group_size`` are ones ``mx.quantize`` takes."""
    if bits not in BITS:
        raise ValueError(f"kv_bits must be one of {BITS}, got {bits!r}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"kv_group_size must be one of {GROUP_SIZES}, got {group_size!r}")


class QuantizedKVCache(MlxLmCacheMethods, quantized_form=True):
    """An attention layer's cache of quantized keys and values (a ``KVLayerCache``).

    ``max_size``: keep only the last ``max_size`` slots in a ring (sliding-window
    layers), as ``RotatingKVCache`` does; None keeps every slot, as ``KVCache``.
    ``keys``/``values`` (mlx-lm's attributes) are the held ``(packed, scales, biases)``.
    """

    def __init__(self, group_size=64, bits=8, max_size=None):
        check_kv_quantization(bits, group_size)
        self.group_size, self.bits, self.max_size = group_size, bits, max_size
        self.keep = 0
        self.parts = [self._new_part() for _ in range(3)]

    def _new_part(self):
        return KVCache() if self.max_size is None else RotatingKVCache(self.max_size)

    def __copy__(self):
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.parts = [copy.copy(p) for p in self.parts]
        return new

    # -- the slot frame: the parts' own ---------------------------------------------
    @property
    def size(self):
        return self.parts[0].size

    @size.setter
    def size(self, value):
        for p in self.parts:
            p.size = value

    @property
    def offset(self):
        """Slots held (mlx-lm compatibility; models never read it)."""
        return self.size

    def key_slots(self, query_len):
        return self.parts[0].key_slots(query_len)

    def keys_in_slot_order(self, query_len):
        return self.parts[0].keys_in_slot_order(query_len)

    def effective_window(self, window):
        return self.parts[0].effective_window(window)

    def layout_key(self):
        return self.parts[0].layout_key()

    def empty(self):
        return self.parts[0].empty()

    @property
    def batch_size(self):
        return self.parts[0].batch_size

    def reserve(self, slots):
        for p in self.parts:
            p.reserve(slots)

    def reset(self):
        for p in self.parts:
            p.reset()

    def is_trimmable(self):
        return self.parts[0].is_trimmable()

    def trim(self, n):
        return [p.trim(n) for p in self.parts][0]

    def filter(self, rows):
        for p in self.parts:
            p.filter(rows)

    def drop_leading(self, n):
        for p in self.parts:
            p.drop_leading(n)

    def extend(self, other):
        if not isinstance(other, QuantizedKVCache):
            raise TypeError(f"cannot extend a QuantizedKVCache with a {type(other).__name__}")
        if (other.bits, other.group_size, other.max_size) != (self.bits, self.group_size,
                                                              self.max_size):
            raise ValueError("cannot merge quantized caches of different bits, group size "
                             "or window")
        return [p.extend(q) for p, q in zip(self.parts, other.parts)][0]

    # -- writes and reads: quantize, then the parts in lockstep ----------------------
    def _quantize(self, x):
        return mx.quantize(x, group_size=self.group_size, bits=self.bits)

    @staticmethod
    def _triples(pairs):
        return tuple(k for k, _ in pairs), tuple(v for _, v in pairs)

    def update_and_fetch(self, keys, values):
        """Quantize and append ``(B, H, L, D)`` keys/values; return the quantized triples
        ``(packed, scales, biases)`` of the keys and of the values to attend."""
        qk, qv = self._quantize(keys), self._quantize(values)
        return self._triples([p.update_and_fetch(k, v) for p, k, v in zip(self.parts, qk, qv)])

    def update_shifted(self, keys, values, shift):
        qk, qv = self._quantize(keys), self._quantize(values)
        return self._triples([p.update_shifted(k, v, shift)
                              for p, k, v in zip(self.parts, qk, qv)])

    def ordered(self):
        """The held quantized ``(keys, values)`` triples in time order, or ``(None, None)``."""
        if self.empty():
            return None, None
        return self._triples([p.ordered() for p in self.parts])

    def load_ordered(self, keys, values, size):
        """Hold time-ordered quantized triples ``keys``/``values``, the last at ``size - 1``."""
        for p, k, v in zip(self.parts, keys, values):
            p.load_ordered(k, v, size)

    @property
    def keys(self):
        return None if self.empty() else self.ordered()[0]

    @property
    def values(self):
        return None if self.empty() else self.ordered()[1]

    @property
    def state(self):
        """The held slots' ``[packed, scales, biases]`` of the keys, then of the values
        (time order; empty when none). Settable with the same six arrays."""
        if self.empty():
            return []
        keys, values = self.ordered()
        return [*keys, *values]

    @state.setter
    def state(self, value):
        if not value:
            self.reset()
            return
        value = list(value)
        self.load_ordered(value[:3], value[3:], self._held_to_size(value[0].shape[2]))

    def _held_to_size(self, held):
        # A ring that holds ``max_size`` slots may have seen more: keep the count it had.
        return max(held, self.size) if self.max_size is not None else held

    @property
    def nbytes(self):
        return sum(p.nbytes for p in self.parts)

    @classmethod
    def of(cls, cache, group_size=64, bits=8):
        """:func:`to_quantized` (what ``cache.to_quantized()`` calls)."""
        return to_quantized(cache, group_size, bits)


def to_quantized(cache, group_size=64, bits=8):
    """A :class:`QuantizedKVCache` holding ``cache``'s slots quantized (``cache``: a
    ``KVCache`` or ``RotatingKVCache``; an already quantized cache is returned as is).

    mlx-lm's ``KVCache.to_quantized``; here rings (sliding-window layers) quantize too.
    A ring's sinks (``keep``) are not kept: the quantized ring is a plain window
    (mlx-lm refuses to quantize rotating caches at all; README, "Python API").
    """
    if isinstance(cache, QuantizedKVCache):
        return cache
    if type(cache) not in (KVCache, RotatingKVCache):
        raise TypeError(f"cannot quantize a {type(cache).__name__} cache")
    out = QuantizedKVCache(group_size, bits, getattr(cache, "max_size", None))
    out.reserve(cache.expected)
    if not cache.empty():
        keys, values = cache.ordered()
        out.load_ordered(out._quantize(keys), out._quantize(values), cache.size)
    return out


def quantize_prompt_cache(cache, bits, group_size=64, start=0):
    """Quantize, in place, the key/value layer caches of ``cache`` (a list or
    ``PromptCache``) once they hold at least ``start`` slots, as mlx-lm's
    ``maybe_quantize_kv_cache`` (recurrent state layers stay as they are).
    Returns True when it quantized a layer."""
    changed = False
    for i, c in enumerate(cache):
        if type(c) in (KVCache, RotatingKVCache) and c.size >= start:
            cache[i] = to_quantized(c, group_size, bits)
            changed = True
    return changed


def maybe_quantize_kv_cache(prompt_cache, quantized_kv_start, kv_group_size, kv_bits):
    """mlx-lm's helper: quantize ``prompt_cache``'s key/value layers in place once they
    hold ``quantized_kv_start`` slots (nothing when ``kv_bits`` is None)."""
    if kv_bits is not None:
        quantize_prompt_cache(prompt_cache, kv_bits, kv_group_size, quantized_kv_start)
