"""Views of a layer cache that the batch driver hands the model for one prefill
chunk: the model and the mask see an ordinary cache, the write goes where the
driver needs it (a group of rows, or rows that start at different columns)."""

from .kv_cache import KVCache


class RowsView(KVCache):
    """Rows ``[start, stop)`` of an empty ``KVCache`` of ``batch_size`` rows, seen from
    slot ``first_slot`` on: the cache of a sub-batch prefilled on its own.

    ``BatchEngine`` prefills rows of similar length together so that short rows skip
    the leading columns that are padding for all of them; each group writes its keys
    straight into the shared buffers at its rows and slots. To the model and the mask
    the view is an ordinary full cache whose slot 0 is the parent's ``first_slot``;
    the parent's slots before it stay zero and are padding of those rows. The parent
    holds the slots the views have written.
    """

    def __init__(self, parent, start, stop, first_slot, batch_size, total):
        super().__init__()
        self.parent, self.start, self.stop = parent, start, stop
        self.first, self.rows, self.total = first_slot, batch_size, total

    def update_and_fetch(self, keys, values):
        p = self.parent
        begin, end = self.first + self.size, self.first + self.size + keys.shape[2]
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

    @property
    def state(self):
        # The whole buffers: evaluating them runs this group's writes.
        return [self.parent.keys, self.parent.values]


class ShiftedView:
    """A layer cache seen by one prefill chunk whose rows start at different columns:
    its write goes through ``update_shifted`` (row ``b``'s first ``shift[b]`` columns
    are padding), everything the mask reads is the cache's own."""

    def __init__(self, cache, shift):
        self.cache, self.shift = cache, shift

    def update_and_fetch(self, keys, values):
        return self.cache.update_shifted(keys, values, self.shift)

    @property
    def size(self):
        return self.cache.size

    def key_slots(self, query_len):
        return self.cache.key_slots(query_len)

    def effective_window(self, window):
        return self.cache.effective_window(window)

    def layout_key(self):
        return self.cache.layout_key()

    @property
    def state(self):
        return self.cache.state
