"""mlx-lm's functional SSM interface (``mlx_lm.models.ssm``) over this package's
Mamba-2 scan (``ssm.ssd_scan``).

Code written for mlx-lm calls ``ssm_update``/``ssm_attn`` with the raw time step
``dt`` (softplus and limits applied inside), ``A_log``, a boolean ``mask`` of real
columns ``(B, L)`` and ``lengths`` (real tokens per row from the first column, right
padding). Both become one ``valid`` array: a column outside it is the identity for
the state, as in ``ssd_scan``. The scan is sequential, so mlx-lm's ``step`` (its
chunk size) changes nothing here; results match mlx-lm's at every real column and in
the returned state. This package has no Metal kernels: ``make_ssm_kernel`` returns
None (as mlx-lm's does without Metal) and ``ssm_update_kernel`` computes the kernel's
result with the same scan.
"""

import mlx.core as mx
import mlx.nn as nn

from ..layers.ssm import ssd_scan


def compute_dt(dt, dt_bias, time_step_limit):
    """``clip(softplus(dt + dt_bias), *time_step_limit)`` in float32 (mlx-lm's)."""
    dt = nn.softplus(dt.astype(mx.float32) + dt_bias)
    return mx.clip(dt, time_step_limit[0], time_step_limit[1])


def segsum(x, mask=None):
    """Segment sums of ``x`` ``(..., L)``: ``out[..., i, j] = x[j+1] + ... + x[i]`` for
    ``i > j`` and 0 on and above the diagonal. With ``mask`` ``(B, L)`` (broadcast over
    the head axis 1), masked entries add nothing and any pair touching a masked column
    is ``-inf`` (its decay ``exp`` is 0)."""
    n = x.shape[-1]
    if mask is not None:
        mask = mx.expand_dims(mask, 1)
        x = x * mask
    k = mx.arange(n)
    # terms[..., k, j] = x[k] where k > j; summing rows k <= i gives out[..., i, j].
    terms = mx.where(k[:, None] > k[None, :], x[..., :, None], mx.zeros((), x.dtype))
    out = mx.cumsum(terms, axis=-2)
    if mask is not None:
        both = mask[..., :, None] * mask[..., None, :]
        out = mx.where(both, out, -float("inf"))
    return out


def _valid_columns(b, n, mask, lengths):
    """``(B, n)`` bool: a column is real when ``mask`` says so and it lies before the
    row's ``lengths`` (mlx-lm's ``ArraysCache.make_mask`` builds the same)."""
    valid = mx.ones((b, n), mx.bool_) if mask is None else mask.astype(mx.bool_)
    if lengths is not None:
        valid = valid & (mx.arange(n)[None, :] < mx.array(lengths)[:, None])
    return mx.broadcast_to(valid, (b, n))


def ssm_attn(x, A_log, B, C, D, dt, dt_bias, state=None, time_step_limit=(0.001, 100.0),
             mask=None, lengths=None, step=256):
    """Mamba-2's SSD forward with mlx-lm's signature.

    ``x``: ``(B, L, H, P)``; ``A_log``, ``D``, ``dt_bias``: ``(H,)``; ``B``, ``C``:
    ``(B, L, G, N)``; ``dt``: ``(B, L, H)`` before softplus; ``state``: ``(B, H, P, N)``
    or None. Returns ``(y (B, L, H, P), state)``; ``y`` in the dtype of ``x * D``, the
    state in float32. ``step`` is mlx-lm's chunk size and does not change results."""
    b, n = x.shape[:2]
    dt = compute_dt(dt, dt_bias, time_step_limit)
    A = -mx.exp(A_log.astype(mx.float32))
    valid = _valid_columns(b, n, mask, lengths)
    y, state = ssd_scan(x, dt, A, B, C, D.astype(mx.float32), state, valid)
    out_dtype = (mx.zeros((), x.dtype) * mx.zeros((), D.dtype)).dtype
    return y.astype(out_dtype), state


def ssm_update(hidden_states, A_log, B, C, D, dt, dt_bias, state=None,
               time_step_limit=(0.001, 100.0), mask=None, lengths=None):
    """mlx-lm's entry point for prefill and decode: ``ssm_attn`` (mlx-lm's ops path;
    its Metal decode kernel computes the same step)."""
    return ssm_attn(hidden_states, A_log, B, C, D, dt, dt_bias, state, time_step_limit,
                    mask=mask, lengths=lengths)


def make_ssm_kernel():
    """None: this package builds no Metal kernels (mlx-lm's returns None without Metal)."""
    return None


def ssm_update_kernel(hidden_states, A_log, B, C, D, dt, dt_bias, state, time_step_limit):
    """One decode step with the signature and output dtypes of mlx-lm's Metal kernel
    (``y`` in the input's dtype, the state in its own), computed by ``ssm_attn``."""
    y, new_state = ssm_attn(hidden_states, A_log, B, C, D, dt, dt_bias, state, time_step_limit)
    return y.astype(hidden_states.dtype), new_state.astype(state.dtype)


def create_ssm_mask(h, cache=None):
    """mlx-lm's ``base.create_ssm_mask``: the cache's mask of real columns for the
    ``h.shape[1]`` new ones (``cache.make_mask``), or None without such a cache. This
    package's state caches answer None: their rows are never padded inside a layer
    cache (the ``PromptCache`` records padding)."""
    if cache is not None and hasattr(cache, "make_mask"):
        return cache.make_mask(h.shape[1])
    return None
