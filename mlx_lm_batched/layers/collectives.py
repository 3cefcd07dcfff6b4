"""Collective helpers over ``mx.distributed`` that mlx-lm's ``models.base`` exports."""

import mlx.core as mx


def gather_last_axis(x, group):
    """Concatenate, in rank order, the pieces of ``x``'s last axis that each rank of
    ``group`` holds: ``(..., size)`` on every rank becomes ``(..., ranks * size)``."""
    ranks, size = group.size(), x.shape[-1]
    pieces = mx.distributed.all_gather(x.reshape(-1, size), group=group)  # (ranks * rows, size)
    pieces = pieces.reshape(ranks, -1, size).swapaxes(0, 1)
    return pieces.reshape(*x.shape[:-1], ranks * size)
