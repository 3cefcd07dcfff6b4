"""Per-row state whose length differs between rows (a row-ragged ``StateCache``).

Some layers keep, per row, arrays that grow with the row's own token count (DeepSeek
V4.1's compressed key/value groups, its sliding window before it fills, the rows of
its open compression group). Rows of one batch have different token counts, so each
array is batch first with its second axis right-padded to the longest row; the layer
knows each row's real length from the row's position (``offset``), never from the
cache. Filtering, extracting a row and saving work as for a ``StateCache``; joining
rows pads the second axis to the longer side.
"""

import mlx.core as mx

from .state import StateCache


def _pad_axis1(a, length):
    if a.shape[1] == length:
        return a
    widths = [(0, 0)] * a.ndim
    widths[1] = (0, length - a.shape[1])
    return mx.pad(a, widths)


class RaggedStateCache(StateCache):
    """``n`` arrays ``(B, T, ...)`` per layer; row ``b`` uses a prefix of axis 1 whose
    length the layer derives from the row's token count (the rest is zero padding)."""

    def extend(self, other):
        """Append the rows of ``other``; returns ``(pad_self, pad_other)`` slots of left
        padding the batch adds to each side's rows (identity for the state)."""
        if not isinstance(other, RaggedStateCache) or len(other) != len(self):
            raise ValueError("cannot extend a RaggedStateCache with a different kind of cache")
        if self.empty() or other.empty():
            raise ValueError("cannot extend an empty cache: prefill both first")
        size = max(self.size, other.size)
        pads = (size - self.size, size - other.size)
        arrays = []
        for a, b in zip(self.arrays, other.arrays):
            length = max(a.shape[1], b.shape[1])
            arrays.append(mx.concatenate([_pad_axis1(a, length), _pad_axis1(b, length)], 0))
        self.arrays = arrays
        self.size = size
        return pads


def stack_rows(rows):
    """One batch-first array from per-row arrays ``(1, T_b, ...)``, right-padded on axis 1."""
    length = max(r.shape[1] for r in rows)
    return mx.concatenate([_pad_axis1(r, length) for r in rows], axis=0)
