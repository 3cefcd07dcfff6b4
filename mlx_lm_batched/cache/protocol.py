"""The contract every layer cache of a batch keeps, declared once.

A batch's caches (``PromptCache``) hold one layer cache per layer; the batch driver,
the mask path and the prompt-cache files use them only through the methods below, so
any class implementing :class:`LayerCache` (and, for attention layers,
:class:`KVLayerCache`) works everywhere. ``tests/test_cache_protocol.py`` checks every
cache class against it.

Every layer cache counts *slots*: the columns fed through it, padding included, in
the batch's shared slot frame (see ``layers/masks.py``); each row's padding lives with
the batch (``PromptCache.padding``), never in a layer cache.
"""

from typing import Optional, Protocol, runtime_checkable

import mlx.core as mx


@runtime_checkable
class LayerCache(Protocol):
    """One layer's cache of a batch of rows."""

    size: int  # slots fed so far (padding included)

    @property
    def offset(self) -> int:
        """Slots held (mlx-lm's name; models never read it)."""

    @property
    def state(self) -> list:
        """The arrays to save or evaluate (empty before the first write); settable."""

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held."""

    @property
    def batch_size(self) -> int:
        """Rows held (0 when empty)."""

    def empty(self) -> bool:
        """True before the first write."""

    def reserve(self, slots: int) -> None:
        """Expect about ``slots`` slots (sizes buffers; a hint, never a limit)."""

    def reset(self) -> None:
        """Forget every slot and row."""

    def filter(self, rows) -> None:
        """Keep only ``rows`` (indices into the batch axis)."""

    def drop_leading(self, n: int) -> None:
        """Drop ``n`` leading slots that are padding of every row."""

    def extend(self, other) -> tuple:
        """Append the rows of ``other`` (same kind); returns ``(pad_self, pad_other)``,
        the slots of left padding each side's rows gain."""

    def is_trimmable(self) -> bool:
        """Whether ``trim`` can drop trailing slots."""

    def trim(self, n: int) -> int:
        """Drop the last ``n`` slots; returns how many were dropped."""

    def key_slots(self, query_len: int) -> mx.array:
        """The slot each key returned for ``query_len`` new queries holds (the mask's
        only view of the cache)."""

    def keys_in_slot_order(self, query_len: int) -> bool:
        """True when the keys returned for ``query_len`` new queries hold consecutive
        slots in order, the last one the last query's own (``key_slots`` is a range
        ending at ``size + query_len - 1``): then query ``i`` of a causal mask attends
        no key after index ``K - query_len + i``, and attention may skip those keys."""

    def effective_window(self, window: Optional[int]) -> Optional[int]:
        """The sliding window the mask applies over this cache's keys."""

    def layout_key(self) -> tuple:
        """Equal for caches whose masks are equal (layers share one mask array)."""


@runtime_checkable
class KVLayerCache(LayerCache, Protocol):
    """An attention layer's cache: keys and values per slot."""

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple:
        """Append ``(B, H, L, D)`` keys and values; return the keys and values to attend."""

    def update_shifted(self, keys: mx.array, values: mx.array, shift: mx.array) -> tuple:
        """``update_and_fetch`` for a chunk whose first ``shift[b]`` columns are padding
        of row ``b`` (they join the row's leading padding)."""

    def ordered(self) -> tuple:
        """The held ``(keys, values)`` in time order, or ``(None, None)``."""

    def load_ordered(self, keys: mx.array, values: mx.array, size: int) -> None:
        """Hold time-ordered ``keys``/``values``, the last at slot ``size - 1``."""


class FullSlotFrame:
    """The mask's view of a cache that keeps every slot in order (a full key/value cache,
    and a recurrent state layer, which shares the batch's slot frame with the attention
    layers of a hybrid model so that both use one mask)."""

    def key_slots(self, query_len):
        return mx.arange(self.size + query_len)

    def keys_in_slot_order(self, query_len):
        return True

    def effective_window(self, window):
        return window

    def layout_key(self):
        return ("full", self.size)
