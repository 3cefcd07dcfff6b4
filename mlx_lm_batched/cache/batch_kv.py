"""mlx-lm's ``BatchKVCache``: one attention layer's cache of a left-padded batch that
carries each row's padding itself (``left_padding``), for code written for mlx-lm that
builds one per layer and calls the model with the plain list.

Here a batch's padding lives with the batch (``PromptCache.padding``); a plain list of
these caches is read as a ``PromptCache`` with that padding (``as_prompt_cache``), so
positions and masks are this package's own. The storage is ``KVCache``'s.
"""

import mlx.core as mx

from .kv import KVCache


class BatchKVCache(KVCache):
    """A ``KVCache`` whose rows have ``left_padding[b]`` padding slots (mlx-lm's
    constructor; ``left_padding`` and the per-row ``offset`` are ``(B,)`` arrays)."""

    def __init__(self, left_padding):
        super().__init__()
        self.left_padding = mx.array(left_padding, dtype=mx.int32)

    @property
    def offset(self):
        """``(B,)`` real tokens each row holds (mlx-lm's: slots minus padding)."""
        return self.size - self.left_padding

    def filter(self, rows):
        """Keep only ``rows``; their padding goes with them."""
        super().filter(rows)
        self.left_padding = self.left_padding[mx.array(rows)]

    def extend(self, other):
        """Append ``other``'s rows (a ``BatchKVCache``); the shorter side's rows gain
        the padding that aligns both."""
        pads = super().extend(other)
        self.left_padding = mx.concatenate([self.left_padding + pads[0],
                                            other.left_padding + pads[1]])
        return pads
