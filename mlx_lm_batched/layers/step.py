"""What one forward call hands every layer besides the hidden states: each row's
``offset`` (positions), the per-layer masks built from it, and the driver's per-step
attention data. Layers read these from their arguments, never from caches."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx

from ..cache.prompt_cache import cache_offsets
from . import masks as masks_lib


@dataclass(frozen=True)
class StepAttention:
    """Per-step attention data the batch driver hands the model with ``offset`` and
    ``mask``; layers read it from their arguments, never from caches.

    ``row_groups``: for a decode step (one query per row), contiguous row groups
    ``(start, stop, first_slot)`` whose attention skips the key slots before
    ``first_slot``, padding for all their rows (None: one call over every slot).
    """

    row_groups: Optional[tuple] = None


def resolve_offset(inputs, offset, cache):
    """Per-row position of the first input column, as an ``(B,)`` int32 array.

    The batch driver always passes it. Callers that don't (mlx-lm style
    ``model(x, cache=cache)``) get the positions the batch's ``PromptCache`` records
    (a plain list of caches holds unpadded rows).
    """
    B = inputs.shape[0]
    if offset is None:
        return cache_offsets(cache, B)
    if not isinstance(offset, mx.array):
        offset = mx.array(offset, dtype=mx.int32)
    if offset.ndim == 0:
        offset = mx.broadcast_to(offset, (B,))
    return offset.astype(mx.int32)


def resolve_masks(mask, cache, windows, query_len, offset, chunks=None, block_sparse=None):
    """Per-layer masks: the caller's (one array, or a list per layer) or built here
    (``chunks``: per-layer attention chunk sizes, ``block_sparse``: per-layer
    block-sparse patterns, see ``masks.masks_for_layers``)."""
    if isinstance(mask, (list, tuple)):
        return list(mask)
    if isinstance(mask, mx.array):
        return [mask] * len(windows)
    return masks_lib.masks_for_layers(cache, windows, query_len, offset, chunks, block_sparse)
