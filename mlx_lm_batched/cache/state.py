"""Per-row recurrent state of one layer (convolution and SSM/linear-attention state).

A ``StateCache`` holds a short list of arrays whose first axis is the batch (e.g. the
last ``kernel - 1`` convolution inputs and the SSM state of each row), like mlx-lm's
``ArraysCache``. It also counts the *slots* fed through it (``size``), padding
included, so it shares the batch's slot frame with the key/value caches of a hybrid
model: a row's real tokens are ``size - padding`` as for every other layer cache.

Left padding is the identity for the state (the layers zero what a padding column
feeds into the recurrence), so a row's state depends only on its own tokens: rows
can be filtered, joined (``extend``) and dropped without touching the arrays' values.
The state of a sequence cannot be cut back to an earlier token: not trimmable.
"""

import mlx.core as mx

from .protocol import FullSlotFrame


class StateCache(FullSlotFrame):
    """Recurrent state of one layer for a batch of rows: ``n`` arrays, batch first (a
    :class:`~.protocol.LayerCache`; the mask path treats it like a full cache of ``size``
    slots, so hybrid models share one mask between it and their attention layers)."""

    def __init__(self, n=2, left_padding=None):
        if left_padding is not None:
            raise NotImplementedError(
                "ArraysCache(left_padding=...) is not supported: a batch's padding lives in "
                "its PromptCache; use PromptCache(caches, padding=left_padding)")
        self.arrays = [None] * n
        self.size = 0

    @property
    def cache(self):
        """The state arrays (mlx-lm's ``ArraysCache.cache``)."""
        return self.arrays

    @cache.setter
    def cache(self, value):
        self.arrays = list(value)

    def make_mask(self, N):
        """mlx-lm's state mask for ``N`` new columns: None, rows here are never padded
        inside a layer cache (the ``PromptCache`` records padding)."""
        return None

    def extract(self, idx):
        """Row ``idx`` as a one-row cache of the same kind (mlx-lm's ``extract``)."""
        new = type(self)(len(self))
        new.arrays = [None if a is None else a[idx : idx + 1] for a in self.arrays]
        new.size = self.size
        return new

    def __getitem__(self, i):
        return self.arrays[i]

    def __setitem__(self, i, value):
        self.arrays[i] = value

    def __len__(self):
        return len(self.arrays)

    @property
    def offset(self):
        """Slots fed (mlx-lm compatibility; models never read it)."""
        return self.size

    def advance(self, n):
        """Count ``n`` more slots fed through the layer (called by the layer)."""
        self.size += int(n)

    def empty(self):
        """True before the first write."""
        return self.arrays[0] is None

    @property
    def batch_size(self):
        return next((a.shape[0] for a in self.arrays if a is not None), 0)

    def reserve(self, slots):
        """Nothing to reserve: the state does not grow with the sequence."""

    def reset(self):
        """Forget the state and every slot."""
        self.arrays = [None] * len(self.arrays)
        self.size = 0

    @property
    def state(self):
        """The state arrays (empty when none)."""
        return [] if self.empty() else list(self.arrays)

    @state.setter
    def state(self, value):
        if not value:
            self.reset()
            return
        if len(value) == 3 and isinstance(value[0], (list, tuple)):
            # mlx-lm's ArraysCache state: (arrays, left_padding, lengths)
            if value[1] is not None or value[2] is not None:
                raise NotImplementedError("an ArraysCache state with left_padding or lengths "
                                          "is not supported: use a PromptCache's padding")
            value = value[0]
        self.arrays = list(value)

    def is_trimmable(self):
        """Recurrent state cannot be rewound to an earlier token."""
        return False

    def trim(self, n):
        return 0

    def filter(self, rows):
        """Keep only ``rows`` (indices into the batch axis)."""
        rows = mx.array(rows)
        self.arrays = [None if a is None else a[rows] for a in self.arrays]

    def drop_leading(self, n):
        """Drop ``n`` leading padding slots every row shares (the state is unchanged)."""
        if n > 0:
            self.size = max(0, self.size - n)

    def extend(self, other):
        """Append the rows of ``other``; returns ``(pad_self, pad_other)`` slots of left
        padding the batch adds to each side's rows (identity for the state)."""
        if not isinstance(other, StateCache) or len(other) != len(self):
            raise ValueError("cannot extend a StateCache with a different kind of cache")
        if self.empty() or other.empty():
            raise ValueError("cannot extend an empty cache: prefill both first")
        size = max(self.size, other.size)
        pads = (size - self.size, size - other.size)
        self.arrays = [mx.concatenate([a, b], axis=0) for a, b in zip(self.arrays, other.arrays)]
        self.size = size
        return pads

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self.arrays if a is not None)
