"""Sampling parameters checked and shaped for a batch: one value for every row or one
per row (an ``(N, 1)`` array that broadcasts over ``(B, V)`` logits), with
``ValueError`` naming the parameter, as mlx-lm users of these functions expect."""

import math
import numbers
from typing import Optional

import mlx.core as mx


# Scalars and sequences of them (sampling parameters, sizes)
def is_int(v) -> bool:
    """An integer that is not a bool (numpy / mx integer scalars count)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v) -> bool:
    """A real number that is not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


# Sampling parameters (sample_utils / logits_processors): ValueError on bad values,
# as mlx-lm users of these functions expect one exception type per parameter.
def real_checker(name: str, lo: float, hi: float, finite: bool = False):
    """Checker for a real number in [lo, hi] (``not (lo <= v <= hi)`` also rejects NaN)."""
    kind = "a finite number" if finite else "a number"
    rng = "" if lo == -math.inf else f" >= {lo}" if hi == math.inf else f" in [{lo}, {hi}]"

    def check(v):
        if not is_real(v) or not (lo <= v <= hi) or (finite and not math.isfinite(v)):
            raise ValueError(f"{name} must be {kind}{rng}, got {v!r}")

    return check


def int_checker(name: str, lo: int, hi: Optional[int] = None):
    """Checker for an integer in [lo, hi] raising ``ValueError`` (sampling parameters)."""
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi})"

    def check(v):
        if not is_int(v) or v < lo or (hi is not None and v >= hi):
            raise ValueError(f"{name} must be an integer {rng}, got {v!r}")

    return check


def row_param(name: str, value, check, dtype=mx.float32):
    """Validate a scalar-or-per-row parameter.

    Returns a Python scalar, or an ``(N, 1)`` array (one value per row) that
    broadcasts against ``(B, V)`` logits.
    """
    if isinstance(value, mx.array):
        if value.ndim > 1:
            raise ValueError(f"{name} must be a scalar or a 1-D list of per-row values, "
                             f"got shape {tuple(value.shape)}")
        per_row = value.ndim > 0
        values = value.tolist() if per_row else [value.item()]
    elif hasattr(value, "__len__") and not isinstance(value, (str, bytes, dict)):
        per_row = True
        # .item() turns numpy / mx scalars into Python numbers for the checks.
        values = [v.item() if hasattr(v, "item") else v for v in value]
    else:
        per_row, values = False, [value]
    if per_row and len(values) == 0:
        raise ValueError(f"{name} must not be an empty sequence")
    for v in values:
        check(v)
    if not per_row:
        return values[0]
    return mx.array(values, dtype=dtype).reshape(-1, 1)


def check_rows(name: str, p, batch: int):
    """Per-row parameters must match the batch (a single value broadcasts)."""
    if isinstance(p, mx.array) and p.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} has {p.shape[0]} per-row values but the batch has {batch} rows"
        )


def as_2d(x: mx.array):
    """View a 1-D single-sequence input as a batch of one: ``(x2d, was_1d)``."""
    return (x[None], True) if x.ndim == 1 else (x, False)
