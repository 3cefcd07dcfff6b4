"""Key/value caches of one attention layer for a batch of left-padded rows.

All rows of a batch share one slot frame (see ``masks.py``): a layer cache stores keys
and values per slot; each row's padding lives with the batch (``PromptCache``), never
here. Each cache says which slots the keys it returns hold (``key_slots``), which is
all the mask needs.

- ``KVCache`` keeps every slot. Its buffers grow in chunks: at most ``RESERVE_AHEAD``
  slots past what is needed (fewer when the driver expects fewer, see ``reserve``), so
  memory follows what is generated and decoding does not copy the cache every token.
- ``RotatingKVCache`` (``rotating.py``) keeps the last ``max_size`` slots in a ring.

A ``KVCache`` of a batch prefilled group by group stores each group of rows in its own
buffer from the group's first real slot (``row_blocks.py``), so short rows do not keep
the long rows' slots; decode attention reads those buffers by row group
(``update_and_fetch_groups``). Any other use sees the usual rectangle: a caller that
fetches all rows at once (``update_and_fetch``) turns the cache back into one buffer.

Both support removing rows (``filter``), appending rows of another cache (``extend``)
and appending a chunk whose rows start at different columns (``update_shifted``).
"""

import mlx.core as mx

from . import row_blocks
from .buffers import key_value_buffers
from .compat import MlxLmCacheMethods
from .row_blocks import pad_left
from .protocol import FullSlotFrame

# Slots a cache allocates beyond those needed when the driver expects more: bounded,
# so a huge ``max_tokens`` reserves nothing it has not generated yet, and large enough
# that growing (one copy of the cache) happens once per this many decode steps; each
# decode step reads the whole cache anyway, so the copies cost well under 1%.
RESERVE_AHEAD = 256


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


class KVCache(FullSlotFrame, MlxLmCacheMethods):
    """Cache of every slot, for global attention layers (a :class:`KVLayerCache`)."""

    step = 256
    blocks = None  # list of ``row_blocks.RowBlock`` when stored by row blocks

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
        self.blocks = None
        self.size = 0

    def unblock(self):
        """Store the slots as one rectangle again (no-op when they are)."""
        if self.blocks is not None:
            blocks, self.blocks = self.blocks, None
            self.keys, self.values = row_blocks.materialize(blocks, self.size)

    def add_block(self, start, stop, first, keys, values, needed):
        """Store rows ``[start, stop)`` from slot ``first`` in a buffer of their own,
        shaped like ``keys``/``values``, with room for ``needed`` slots of the frame
        (more when the cache expects more; a grouped prefill's first write, see
        ``views.RowsView``). Returns the block."""
        if self.keys is not None:
            raise ValueError("a cache holding a rectangle cannot take row blocks")
        block = row_blocks.new_block(start, stop, first, keys, values,
                                     self._capacity(needed) - first)
        self.blocks = sorted((self.blocks or []) + [block], key=lambda b: b.start)
        return block

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
        new_k, new_v = key_value_buffers((B, H, capacity, Dk),
                                         (B, H, capacity, values.shape[3]),
                                         keys.dtype, values.dtype)
        if self.keys is not None and self.size > 0:
            new_k[..., : self.size, :] = self.keys[..., : self.size, :]
            new_v[..., : self.size, :] = self.values[..., : self.size, :]
        self.keys, self.values = new_k, new_v

    @classmethod
    def sharing(cls, head_keys, head_values):
        """A one-row cache whose first slots are the shared segments ``head_keys`` /
        ``head_values`` (lists of ``(1, H, n_i, D)``, the KV block store's arrays, held
        and read in place: see ``row_blocks.py``); later slots go to its own buffer."""
        cache = cls()
        k0, v0 = head_keys[0], head_values[0]
        cache.blocks = [row_blocks.with_head(
            head_keys, head_values, mx.zeros((1, k0.shape[1], 0, k0.shape[3]), k0.dtype),
            mx.zeros((1, v0.shape[1], 0, v0.shape[3]), v0.dtype))]
        cache.size = sum(k.shape[2] for k in head_keys)
        return cache

    def buffers(self):
        """The arrays this cache writes into (to evaluate after a write), without
        joining row blocks or a shared head into one array."""
        if self.blocks is not None:
            return [x for b in self.blocks for x in (b.keys, b.values)]
        return [] if self.keys is None else [self.keys, self.values]

    def update_and_fetch(self, keys, values):
        """Append ``(B, H, L, D)`` keys/values; return all cached keys/values."""
        end = self.size + keys.shape[2]
        if self.blocks is not None:
            row_blocks.write(self.blocks, keys, values, self.size, self._capacity)
            self.size = end
            if len(self.blocks) == 1 and row_blocks.has_heads(self.blocks) and \
                    keys.shape[2] > 1:
                # A prompt's chunk on a shared head (a row continued from cached blocks):
                # the keys joined for this call only; the head stays shared. (Decode
                # steps read the segments in place, ``update_and_fetch_groups``; a
                # device without row groups stores the row densely from its first step.)
                return row_blocks.materialize(self.blocks, end)
            self.unblock()  # every row at once: one rectangle from now on
            return self.keys, self.values
        self.allocate(end, keys, values)
        self.keys[..., self.size : end, :] = keys
        self.values[..., self.size : end, :] = values
        self.size = end
        return self.keys[..., :end, :], self.values[..., :end, :]

    def update_and_fetch_groups(self, keys, values, groups):
        """Append ``(B, H, L, D)`` keys/values; return, per row group ``(start, stop,
        first_slot)``, the lists of the group's cached keys and values from
        ``first_slot`` on (what grouped attention reads), without building the
        rectangle when the cache is stored by row blocks."""
        if self.blocks is not None:
            end = self.size + keys.shape[2]
            row_blocks.write(self.blocks, keys, values, self.size, self._capacity)
            self.size = end
            parts = row_blocks.fetch_groups(self.blocks, groups, end)
            if parts is not None:
                return parts
            self.unblock()  # the groups do not fit the blocks: one rectangle
            k, v = self.keys, self.values
        else:
            k, v = self.update_and_fetch(keys, values)
        return ([k[a:b, :, f:] for a, b, f in groups], [v[a:b, :, f:] for a, b, f in groups])

    def row_slots(self, row, first):
        """Row ``row``'s ``(1, H, size - first, D)`` keys and values from slot ``first``."""
        if self.blocks is not None:
            return row_blocks.row_slots(self.blocks, row, first, self.size)
        r = slice(row, row + 1)
        return self.keys[r, :, first : self.size], self.values[r, :, first : self.size]

    def ordered(self):
        """Cached ``(keys, values)`` in slot order, or ``(None, None)``."""
        if self.blocks is not None:
            return row_blocks.materialize(self.blocks, self.size)
        if self.keys is None:
            return None, None
        return self.keys[..., : self.size, :], self.values[..., : self.size, :]

    def span_reader(self):
        """A function ``(a, b) -> (keys, values)`` of slots ``[a, b)`` of this one-row
        cache: a shared head's segments and the own buffer are sliced where they are;
        any other layout is joined once (``ordered``) and sliced."""
        if self.blocks is not None and len(self.blocks) == 1 and self.blocks[0].first == 0:
            read = row_blocks.span_reader(self.blocks[0])
            if read is not None:
                return read
        keys, values = self.ordered()
        return lambda a, b: (keys[..., a:b, :], values[..., a:b, :])

    def load_ordered(self, keys, values, size):
        """Hold ``keys``/``values``: the slots up to slot ``size`` (exclusive) in order."""
        self.keys, self.values, self.size = keys, values, size
        self.blocks = None

    def update_shifted(self, keys, values, shift):
        """Like ``update_and_fetch`` for a chunk whose first ``shift[b]`` columns are
        padding of row ``b``: they go before the row's cached slots (its padding
        grows by ``shift[b]``), so the row stays contiguous. Copies the cache once."""
        self.unblock()
        old_k, old_v = self.ordered()
        keys = shift_rows(old_k, keys, shift)
        values = shift_rows(old_v, values, shift)
        self.size = 0
        return self.update_and_fetch(keys, values)

    def empty(self):
        """True before the first write (mlx-lm's cache API)."""
        return self.keys is None and not self.blocks

    @property
    def batch_size(self):
        if self.blocks:
            return self.blocks[-1].stop
        return 0 if self.keys is None else self.keys.shape[0]

    @property
    def state(self):
        """The cached slots' ``[keys, values]`` in slot order (empty when none)."""
        if self.blocks is not None:
            return list(row_blocks.materialize(self.blocks, self.size))
        if self.keys is None:
            return []
        return [self.keys[..., : self.size, :], self.values[..., : self.size, :]]

    @state.setter
    def state(self, value):
        self.blocks = None
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
        if self.blocks is not None and any(b.own_first > self.size - n for b in self.blocks):
            self.unblock()  # later writes to those rows would land before their block
        self.size -= n
        return n

    def filter(self, rows):
        """Keep only ``rows`` (indices into the batch axis)."""
        if self.blocks is not None:
            keep = [int(r) for r in (rows.tolist() if isinstance(rows, mx.array) else rows)]
            if all(a < b for a, b in zip(keep, keep[1:])):
                self.blocks = row_blocks.filter_blocks(self.blocks, keep)
                return
            self.unblock()  # a new row order: blocks hold contiguous rows
        if self.keys is not None:
            rows = mx.array(rows)
            self.keys = self.keys[rows]
            self.values = self.values[rows]

    def drop_leading(self, n):
        """Drop the first ``n`` slots (padding every row shares)."""
        if n > 0 and self.blocks is not None:
            row_blocks.drop_leading(self.blocks, n)
            self.size -= n
            return
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
        if self.empty() or other.empty():
            raise ValueError("cannot extend an empty cache: prefill both first")
        if (self.blocks is not None or other.blocks is not None) and \
                type(self) is KVCache and type(other) is KVCache:
            # Blocks join without a copy: each side's padding is a later first slot.
            self.blocks = row_blocks.joined(self.as_blocks(), other.as_blocks(), pads,
                                            self.batch_size)
            self.keys = self.values = None
            self.size = size
            return pads
        parts = []
        for cache, pad in ((self, pads[0]), (other, pads[1])):
            k, v = cache.state
            parts.append((pad_left(k, pad), pad_left(v, pad)))
        self.keys = mx.concatenate([parts[0][0], parts[1][0]], axis=0)
        self.values = mx.concatenate([parts[0][1], parts[1][1]], axis=0)
        self.size = size
        return pads

    def to_blocks(self):
        """Hold the slots as row blocks (a rectangle becomes one block, no copy), so
        that rows joining later (``extend``) keep buffers of their own."""
        if self.blocks is None and self.keys is not None and type(self) is KVCache:
            self.blocks = self.as_blocks()
            self.keys = self.values = None

    def merge_blocks(self, spans):
        """Store each span ``(i, j)`` of neighbouring row blocks as one block (see
        ``engine.prefill_plan.plan_block_merges``), copied now.

        Evaluated here, one layer at a time, the copy of the merged rows sits beside
        its originals for this layer only; left to the next evaluation, every layer's
        copy would be made beside all the originals: the merged rows twice in memory,
        beyond what a KV bound counts."""
        if self.blocks is not None:
            self.blocks = row_blocks.merged(self.blocks, spans)
            mx.eval([(b.keys, b.values) for b, (i, j) in zip(self.blocks, spans) if j > i + 1])

    def as_blocks(self):
        """The slots as row blocks (a rectangle is one block of every row)."""
        if self.blocks is not None:
            return self.blocks
        return [row_blocks.RowBlock(0, self.keys.shape[0], 0, self.keys, self.values)]

    @property
    def nbytes(self):
        if self.blocks is not None:
            return row_blocks.nbytes(self.blocks)
        if self.keys is None:
            return 0
        return self.keys.nbytes + self.values.nbytes
