"""Views of a layer cache that the batch driver hands the model for one prefill
chunk: the model and the mask see an ordinary cache, the write goes where the
driver needs it (a group of rows, or rows that start at different columns)."""

import mlx.core as mx

from .kv import KVCache
from .rotating import RotatingKVCache
from .state import StateCache


class RowsView(KVCache):
    """Rows ``[start, stop)`` of an empty ``KVCache`` of ``batch_size`` rows (or a
    ``RotatingKVCache`` the prefill does not wrap), seen from slot ``first_slot`` on:
    the cache of a sub-batch prefilled on its own.

    ``BatchEngine`` prefills rows of similar length together so that short rows skip
    the leading columns that are padding for all of them; each group writes its keys
    straight into the shared buffers at its rows and slots. To the model and the mask
    the view is an ordinary full cache whose slot 0 is the parent's ``first_slot``;
    the parent's slots before it stay zero and are padding of those rows. The parent
    holds the slots the views have written.

    With ``own_block`` (a full ``KVCache`` parent) the group's rows go to a buffer of
    their own from ``first_slot`` on (``KVCache.add_block``, ``row_blocks.py``), so the
    parent never holds the slots before it; else the first group allocates the
    parent's rectangle of every row.
    """

    def __init__(self, parent, start, stop, first_slot, batch_size, total, own_block=False):
        super().__init__()
        self.parent, self.start, self.stop = parent, start, stop
        self.first, self.rows, self.total = first_slot, batch_size, total
        self.own_block = own_block and type(parent) is KVCache
        self.block = None

    def update_and_fetch(self, keys, values):
        p = self.parent
        begin, end = self.first + self.size, self.first + self.size + keys.shape[2]
        if self.own_block:
            return self._block_update(keys, values, begin, end)
        if p.keys is None:  # the first group allocates what all groups fill
            p.allocate(max(end, self.total), keys, values, batch=self.rows)
        elif end > p.keys.shape[2]:
            raise ValueError(f"a RowsView cannot grow its parent past {p.keys.shape[2]} slots")
        rows = slice(self.start, self.stop)
        p.keys[rows, :, begin:end, :] = keys
        p.values[rows, :, begin:end, :] = values
        self.size += keys.shape[2]
        p.size = max(p.size, end)
        return p.keys[rows, :, self.first : end, :], p.values[rows, :, self.first : end, :]

    def _block_update(self, keys, values, begin, end):
        p = self.parent
        if self.block is None:  # sized for every column of the prompt and what follows
            self.block = p.add_block(self.start, self.stop, self.first, keys, values,
                                     max(end, self.total + 1))
        b = self.block
        if end - b.first > b.keys.shape[2]:
            raise ValueError(f"a RowsView cannot grow its block past {b.keys.shape[2]} slots")
        b.keys[..., begin - b.first : end - b.first, :] = keys
        b.values[..., begin - b.first : end - b.first, :] = values
        self.size += keys.shape[2]
        p.size = max(p.size, end)
        return b.keys[..., : end - b.first, :], b.values[..., : end - b.first, :]

    @property
    def state(self):
        # The whole buffers: evaluating them runs this group's writes.
        if self.block is not None:
            return [self.block.keys, self.block.values]
        return [self.parent.keys, self.parent.values]


class StateRowsView(StateCache):
    """Rows ``[start, stop)`` of an empty ``StateCache`` of ``batch_size`` rows, seen
    from slot ``first_slot`` on: the recurrent state of a sub-batch prefilled on its own.

    The ``RowsView`` of a state layer. The view starts empty (the group's rows start
    from zero state, as they would alone: the columns the group skips are padding for
    all its rows, the identity for the state), and every state array a layer stores is
    also written into the parent's rows, which start as zeros (the state of a row that
    saw only padding). Its ``size`` counts the group's slots from ``first_slot``, the
    frame the group's ``RowsView``s and masks use; the parent counts the slots written.
    """

    def __init__(self, parent, start, stop, first_slot, batch_size):
        super().__init__(len(parent))
        self.parent, self.start, self.stop = parent, start, stop
        self.first, self.rows = first_slot, batch_size

    def __setitem__(self, i, value):
        self.arrays[i] = value
        p = self.parent
        if p.arrays[i] is None:  # the first group allocates what all groups fill
            p.arrays[i] = mx.zeros((self.rows,) + value.shape[1:], value.dtype)
        p.arrays[i][self.start : self.stop] = value

    def advance(self, n):
        super().advance(n)
        self.parent.size = max(self.parent.size, self.first + self.size)

    @property
    def state(self):
        # The parent's whole arrays: evaluating them runs this group's writes.
        return [a for a in self.parent.arrays if a is not None]


def has_rows_view(cache, slots):
    """True when ``rows_view`` can view the fresh layer ``cache`` for a prefill of
    ``slots`` slots: full key/value caches, recurrent state, and ring caches the
    prefill does not wrap (``slots <= max_size``: no slot is overwritten, so the ring
    holds its slots in order, as a full cache does)."""
    if type(cache) is RotatingKVCache:
        return slots <= cache.max_size and not cache.keep  # sinks are found by offset
    return type(cache) in (KVCache, StateCache)


def rows_view(cache, start, stop, first_slot, batch_size, total, own_block=False):
    """The view of rows ``[start, stop)`` from slot ``first_slot`` of a fresh layer cache
    of ``batch_size`` rows that the groups fill to ``total`` slots (see
    ``has_rows_view``); ``own_block``: a full key/value cache stores the group in a
    buffer of its own (``RowsView``)."""
    if type(cache) is StateCache:
        return StateRowsView(cache, start, stop, first_slot, batch_size)
    return RowsView(cache, start, stop, first_slot, batch_size, total, own_block)


class ShiftedView:
    """A layer cache seen by one prefill chunk whose rows start at different columns:
    its write goes through ``update_shifted`` (row ``b``'s first ``shift[b]`` columns
    are padding), everything the mask reads is the cache's own."""

    def __init__(self, cache, shift):
        self.cache, self.shift = cache, shift

    def update_and_fetch(self, keys, values, offset=None):
        if self.wants_offset:
            return self.cache.update_shifted(keys, values, self.shift, offset)
        return self.cache.update_shifted(keys, values, self.shift)

    @property
    def wants_offset(self):
        return getattr(self.cache, "wants_offset", False)

    @property
    def keep(self):
        return getattr(self.cache, "keep", 0)

    @property
    def max_size(self):
        return self.cache.max_size

    @property
    def size(self):
        return self.cache.size

    def key_slots(self, query_len):
        return self.cache.key_slots(query_len)

    def keys_in_slot_order(self, query_len):
        return self.cache.keys_in_slot_order(query_len)

    def effective_window(self, window):
        return self.cache.effective_window(window)

    def layout_key(self):
        return self.cache.layout_key()

    @property
    def state(self):
        return self.cache.state
