"""Row blocks: a full key/value cache stored as one buffer per group of rows.

A batch's rows share one slot frame (``masks.py``): row ``b`` holds real tokens in its
last ``size - padding[b]`` slots and padding before. Stored as one ``(B, H, slots, D)``
rectangle, every row keeps as many slots as the longest one: on mixed prompt lengths
most of a batch's cache is padding (2.1x the ideal for 32 prompts of 22-458 tokens).

A :class:`RowBlock` holds rows ``[start, stop)`` from slot ``first`` on, the first
slot any of its rows uses; the slots before it are padding of all its rows and are
never stored. A cache of blocks keeps the batch's single slot frame and single model
call: the projections still run over all rows at once, and decode attention, which
already runs by row groups on the CPU (``attention.grouped_attention``), reads each
group's keys from its block. Values in every stored slot equal the rectangle's, so
results are bit-identical.

A block of one row may also start with a **shared head**: the keys and values of a
prefix that other rows and the KV block store hold too (``kv_blocks.py``: a prompt's
cached blocks), kept as the store's own arrays, one segment per block, never copied.
Its own buffer then holds the slots after the head. Decode attention reads the head's
segments and the buffer in place (``_cpu_prims.attend`` over segments: the same bits
as one array); everything that needs one array (``materialize``, ``row_slots``, a
merge) joins them, which leaves the stored head untouched.

The functions here work on a list of blocks covering rows ``0..B-1`` in order; the
``KVCache`` in ``kv.py`` decides when to use them.
"""

from dataclasses import dataclass

import mlx.core as mx

from .buffers import key_value_buffers


class KVSegments(list):
    """Keys (or values) of one row group's consecutive slots held in several arrays, in
    slot order: a shared head's blocks, then the group's own slots. Attention reads them
    in place where it can (``_cpu_prims.attend``) and joins them elsewhere."""


@dataclass
class RowBlock:
    """Rows ``[start, stop)`` of a batch; ``keys``/``values`` ``(rows, H, capacity, D)``
    hold slots ``own_first .. own_first + capacity`` (those below the cache's size are
    real). ``head``: ``(key segments, value segments)``, each ``(1, H, n_i, D)``, the
    shared slots ``first .. own_first`` of a one-row block (None: no head)."""

    start: int
    stop: int
    first: int
    keys: mx.array
    values: mx.array
    head: tuple = None

    @property
    def rows(self):
        return self.stop - self.start

    @property
    def head_slots(self):
        return sum(k.shape[2] for k in self.head[0]) if self.head else 0

    @property
    def own_first(self):
        """The first slot of the block's own buffer (after its shared head)."""
        return self.first + self.head_slots

    def moved(self, start, first):
        """This block at row ``start`` and first slot ``first`` (the same arrays)."""
        return RowBlock(start, start + self.rows, first, self.keys, self.values, self.head)

    def joined_head(self, own_keys, own_values):
        """The head's segments then ``own_keys``/``own_values``, as one array each."""
        if not self.head:
            return own_keys, own_values
        return (mx.concatenate([*self.head[0], own_keys], axis=2),
                mx.concatenate([*self.head[1], own_values], axis=2))


def with_head(head_keys, head_values, own_keys, own_values):
    """A one-row block from slot 0: the shared segments ``head_keys``/``head_values``
    (lists of ``(1, H, n_i, D)``), then its own ``own_keys``/``own_values`` slots."""
    return RowBlock(0, 1, 0, own_keys, own_values, (list(head_keys), list(head_values)))


def new_block(start, stop, first, keys, values, capacity):
    """An empty block of rows ``[start, stop)`` from slot ``first``, ``capacity`` slots,
    heads, dims and dtype of ``keys``/``values``."""
    shape = (stop - start, keys.shape[1], capacity)
    return RowBlock(start, stop, first, *key_value_buffers(
        (*shape, keys.shape[3]), (*shape, values.shape[3]), keys.dtype, values.dtype))


def pad_left(x, n):
    """Prepend ``n`` zero slots on the sequence axis (axis 2)."""
    if n == 0 or x is None:
        return x
    pad = mx.zeros((*x.shape[:2], n, x.shape[3]), dtype=x.dtype)
    return mx.concatenate([pad, x], axis=2)


def materialize(blocks, size):
    """The blocks' slots ``[0, size)`` as one ``(keys, values)`` rectangle (zeros where a
    block does not store: padding of all its rows)."""
    parts_k, parts_v = [], []
    for b in blocks:
        held = max(0, size - b.first)
        k, v = b.joined_head(b.keys[..., :max(0, size - b.own_first), :],
                             b.values[..., :max(0, size - b.own_first), :])
        parts_k.append(pad_left(k, size - held))
        parts_v.append(pad_left(v, size - held))
    return mx.concatenate(parts_k, axis=0), mx.concatenate(parts_v, axis=0)


def grow(block, needed, capacity):
    """Make ``block`` hold at least ``needed`` slots from its first: when it must grow,
    ``capacity`` slots, its held slots first and zeros after."""
    held = block.keys.shape[2]
    if needed <= held:
        return
    k, v = block.keys, block.values
    block.keys, block.values = key_value_buffers((*k.shape[:2], capacity, k.shape[3]),
                                                 (*v.shape[:2], capacity, v.shape[3]),
                                                 k.dtype, v.dtype)
    block.keys[..., :held, :] = k
    block.values[..., :held, :] = v


def write(blocks, keys, values, size, capacity_for):
    """Write the ``(B, H, L, D)`` columns for slots ``[size, size + L)`` into each block
    (a block whose first slot is later skips the columns before it: padding of all
    its rows). ``capacity_for(end)``: slots to allocate, counted from slot 0, when a
    block must grow to hold slot ``end - 1``."""
    end = size + keys.shape[2]
    _cover(blocks, keys, values, size, capacity_for(end) - size)
    for b in blocks:
        own = b.own_first
        begin = max(size, own)  # a head is never written: its slots are below ``size``
        if begin >= end:
            continue
        grow(b, end - own, capacity_for(end) - own)
        rows, cols = slice(b.start, b.stop), slice(begin - size, end - size)
        b.keys[..., begin - own : end - own, :] = keys[rows, :, cols]
        b.values[..., begin - own : end - own, :] = values[rows, :, cols]


def uncovered(blocks, rows):
    """The ``(start, stop)`` row ranges of a batch of ``rows`` rows that no block holds
    (a grouped prefill's rows with nothing before their last column)."""
    starts = [0] + [b.stop for b in blocks]
    stops = [b.start for b in blocks] + [rows]
    return [(a, z) for a, z in zip(starts, stops) if z > a]


def _cover(blocks, keys, values, size, capacity):
    """Give rows no block holds a block from slot ``size``: they held only padding."""
    gaps = uncovered(blocks, keys.shape[0])
    if gaps:
        blocks += [new_block(a, z, size, keys, values, capacity) for a, z in gaps]
        blocks.sort(key=lambda b: b.start)


def fetch_groups(blocks, groups, end):
    """Per row group ``(start, stop, first_slot)``: its rows' keys and values for slots
    ``[first_slot, end)``, read from the block holding them; None when a group spans
    blocks or starts before its block's first slot."""
    keys, values = [], []
    for start, stop, first in groups:
        b = next((b for b in blocks if b.start <= start and stop <= b.stop), None)
        if b is None or first < b.first or (b.head and first != b.first):
            return None
        if b.head:  # the shared segments, then the row's own slots: read in place
            keys.append(KVSegments([*b.head[0], b.keys[..., : end - b.own_first, :]]))
            values.append(KVSegments([*b.head[1], b.values[..., : end - b.own_first, :]]))
            continue
        rows, cols = slice(start - b.start, stop - b.start), slice(first - b.first, end - b.first)
        keys.append(b.keys[rows, :, cols])
        values.append(b.values[rows, :, cols])
    return keys, values


def span_reader(block):
    """A function ``(a, b) -> (keys, values)`` of a one-row block's slots ``[a, b)``,
    read where they are held when the span lies in one shared segment or in the own
    buffer (no join: a block store slices new blocks from a finished row this way);
    None when the block has no head (read it as one array)."""
    if not block.head:
        return None

    def read(a, b):
        at = block.first
        for k, v in zip(*block.head):
            n = k.shape[2]
            if at <= a and b <= at + n:
                return k[..., a - at : b - at, :], v[..., a - at : b - at, :]
            at += n
        own = block.own_first
        if a >= own:
            return block.keys[..., a - own : b - own, :], block.values[..., a - own : b - own, :]
        k, v = block.joined_head(block.keys, block.values)  # a span across the seam
        return k[..., a - block.first : b - block.first, :], v[..., a - block.first : b - block.first, :]

    return read


def row_slots(blocks, row, first, end):
    """Row ``row``'s ``(1, H, end - first, D)`` keys and values for slots ``[first, end)``
    (``first``: at or after its block's first slot)."""
    b = next(b for b in blocks if b.start <= row < b.stop)
    rows = slice(row - b.start, row - b.start + 1)
    lo = max(first, b.first) - b.first
    pad = max(0, b.first - first)  # only padding lies before the block's first slot
    k, v = b.joined_head(b.keys[rows, :, : max(0, end - b.own_first)],
                         b.values[rows, :, : max(0, end - b.own_first)])
    return pad_left(k[..., lo:, :], pad), pad_left(v[..., lo:, :], pad)


def filter_blocks(blocks, keep):
    """The blocks of rows ``keep`` (increasing indices), renumbered from 0."""
    out, row = [], 0
    for b in blocks:
        mine = [r - b.start for r in keep if b.start <= r < b.stop]
        if not mine:
            continue
        if len(mine) == b.rows:  # (a block with a head has one row)
            out.append(b.moved(row, b.first))
        else:
            idx = mx.array(mine, dtype=mx.int32)
            out.append(RowBlock(row, row + len(mine), b.first, b.keys[idx], b.values[idx]))
        row += len(mine)
    return out


def drop_leading(blocks, n):
    """The frame's first ``n`` slots (padding of every row) removed: blocks shift left,
    a block that stored some of them drops those."""
    for b in blocks:
        if b.first >= n:
            b.first -= n
            continue
        if b.head:  # (not reached: a head's slots are its row's tokens, never padding)
            b.keys, b.values = b.joined_head(b.keys, b.values)
            b.head = None
        b.keys, b.values = b.keys[..., n - b.first :, :], b.values[..., n - b.first :, :]
        b.first = 0


def joined(ours, theirs, pads, rows):
    """``ours`` then ``theirs`` (rows moved after our ``rows``), each side's first slots
    moved right by its new left padding ``pads``."""
    out = [b.moved(b.start, b.first + pads[0]) for b in ours]
    out += [b.moved(b.start + rows, b.first + pads[1]) for b in theirs]
    return out


def merged(blocks, spans):
    """``blocks`` with each span ``(i, j)`` of neighbours stored as one block (a copy of
    their slots, padded to the span's earliest first slot; the engine plans the spans,
    ``engine.prefill_plan.plan_block_merges``)."""
    return [blocks[i] if j == i + 1 else _merge(blocks[i:j]) for i, j in spans]


def _merge(run):
    # A head joins its row's buffer here (a copy): the engine does not plan merges of
    # blocks with heads (``plan_block_merges``), which would give up the sharing.
    own = [b.joined_head(b.keys, b.values) for b in run]
    first = min(b.first for b in run)
    width = max(b.first + k.shape[2] for b, (k, _) in zip(run, own)) - first

    def placed(x, at):
        return mx.pad(x, [(0, 0), (0, 0), (at - first, width - (at - first) - x.shape[2]),
                          (0, 0)])

    return RowBlock(run[0].start, run[-1].stop, first,
                    mx.concatenate([placed(k, b.first) for b, (k, _) in zip(run, own)], axis=0),
                    mx.concatenate([placed(v, b.first) for b, (_, v) in zip(run, own)], axis=0))


def nbytes(blocks):
    """Bytes of the blocks' own buffers (a shared head is the block store's)."""
    return sum(b.keys.nbytes + b.values.nbytes for b in blocks)


def has_heads(blocks):
    """True when some block of ``blocks`` starts with a shared head."""
    return any(b.head for b in blocks or ())
