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

The functions here work on a list of blocks covering rows ``0..B-1`` in order; the
``KVCache`` in ``kv.py`` decides when to use them.
"""

from dataclasses import dataclass

import mlx.core as mx

@dataclass
class RowBlock:
    """Rows ``[start, stop)`` of a batch; ``keys``/``values`` ``(rows, H, capacity, D)``
    hold slots ``first .. first + capacity`` (those below the cache's size are real)."""

    start: int
    stop: int
    first: int
    keys: mx.array
    values: mx.array

    @property
    def rows(self):
        return self.stop - self.start


def new_block(start, stop, first, keys, values, capacity):
    """An empty block of rows ``[start, stop)`` from slot ``first``, ``capacity`` slots,
    heads, dims and dtype of ``keys``/``values``."""
    shape = (stop - start, keys.shape[1], capacity)
    return RowBlock(start, stop, first, mx.zeros((*shape, keys.shape[3]), keys.dtype),
                    mx.zeros((*shape, values.shape[3]), values.dtype))


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
        parts_k.append(pad_left(b.keys[..., :held, :], size - held))
        parts_v.append(pad_left(b.values[..., :held, :], size - held))
    return mx.concatenate(parts_k, axis=0), mx.concatenate(parts_v, axis=0)


def grow(block, needed, capacity):
    """Make ``block`` hold at least ``needed`` slots from its first: when it must grow,
    ``capacity`` slots, its held slots first and zeros after."""
    held = block.keys.shape[2]
    if needed <= held:
        return
    widths = [(0, 0), (0, 0), (0, capacity - held), (0, 0)]
    block.keys, block.values = mx.pad(block.keys, widths), mx.pad(block.values, widths)


def write(blocks, keys, values, size, capacity_for):
    """Write the ``(B, H, L, D)`` columns for slots ``[size, size + L)`` into each block
    (a block whose first slot is later skips the columns before it: padding of all
    its rows). ``capacity_for(end)``: slots to allocate, counted from slot 0, when a
    block must grow to hold slot ``end - 1``."""
    end = size + keys.shape[2]
    _cover(blocks, keys, values, size, capacity_for(end) - size)
    for b in blocks:
        begin = max(size, b.first)
        if begin >= end:
            continue
        grow(b, end - b.first, capacity_for(end) - b.first)
        rows, cols = slice(b.start, b.stop), slice(begin - size, end - size)
        b.keys[..., begin - b.first : end - b.first, :] = keys[rows, :, cols]
        b.values[..., begin - b.first : end - b.first, :] = values[rows, :, cols]


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
        if b is None or first < b.first:
            return None
        rows, cols = slice(start - b.start, stop - b.start), slice(first - b.first, end - b.first)
        keys.append(b.keys[rows, :, cols])
        values.append(b.values[rows, :, cols])
    return keys, values


def row_slots(blocks, row, first, end):
    """Row ``row``'s ``(1, H, end - first, D)`` keys and values for slots ``[first, end)``
    (``first``: at or after its block's first slot)."""
    b = next(b for b in blocks if b.start <= row < b.stop)
    rows = slice(row - b.start, row - b.start + 1)
    lo = max(first, b.first) - b.first
    pad = max(0, b.first - first)  # only padding lies before the block's first slot
    return (pad_left(b.keys[rows, :, lo : end - b.first], pad),
            pad_left(b.values[rows, :, lo : end - b.first], pad))


def filter_blocks(blocks, keep):
    """The blocks of rows ``keep`` (increasing indices), renumbered from 0."""
    out, row = [], 0
    for b in blocks:
        mine = [r - b.start for r in keep if b.start <= r < b.stop]
        if not mine:
            continue
        if len(mine) == b.rows:
            k, v = b.keys, b.values
        else:
            idx = mx.array(mine, dtype=mx.int32)
            k, v = b.keys[idx], b.values[idx]
        out.append(RowBlock(row, row + len(mine), b.first, k, v))
        row += len(mine)
    return out


def drop_leading(blocks, n):
    """The frame's first ``n`` slots (padding of every row) removed: blocks shift left,
    a block that stored some of them drops those."""
    for b in blocks:
        if b.first >= n:
            b.first -= n
        else:
            b.keys, b.values = b.keys[..., n - b.first :, :], b.values[..., n - b.first :, :]
            b.first = 0


def joined(ours, theirs, pads, rows):
    """``ours`` then ``theirs`` (rows moved after our ``rows``), each side's first slots
    moved right by its new left padding ``pads``."""
    out = [RowBlock(b.start, b.stop, b.first + pads[0], b.keys, b.values) for b in ours]
    out += [RowBlock(b.start + rows, b.stop + rows, b.first + pads[1], b.keys, b.values)
            for b in theirs]
    return out


def merged(blocks, spans):
    """``blocks`` with each span ``(i, j)`` of neighbours stored as one block (a copy of
    their slots, padded to the span's earliest first slot; the engine plans the spans,
    ``engine.prefill_plan.plan_block_merges``)."""
    return [blocks[i] if j == i + 1 else _merge(blocks[i:j]) for i, j in spans]


def _merge(run):
    first = min(b.first for b in run)
    width = max(b.first + b.keys.shape[2] for b in run) - first

    def placed(x, at):
        return mx.pad(x, [(0, 0), (0, 0), (at - first, width - (at - first) - x.shape[2]),
                          (0, 0)])

    return RowBlock(run[0].start, run[-1].stop, first,
                    mx.concatenate([placed(b.keys, b.first) for b in run], axis=0),
                    mx.concatenate([placed(b.values, b.first) for b in run], axis=0))


def nbytes(blocks):
    return sum(b.keys.nbytes + b.values.nbytes for b in blocks)
