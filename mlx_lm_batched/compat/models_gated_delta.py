"""mlx-lm's functional gated-delta interface (``mlx_lm.models.gated_delta``) over this
package's recurrence (``gated_delta.gated_delta_rule``).

mlx-lm's conventions differ from the layer's in three ways, converted here: its decay
``g`` is the factor ``exp(log decay)`` (the layer takes the log), its state is
``(B, Hv, Dv, Dk)`` (the layer's is ``(B, Hv, Dk, Dv)``), and its recurrence applies no
``Dk ** -0.5`` readout scale (callers fold it into ``q`` with ``normalize_qk``; the
layer applies it itself, so ``q`` is scaled up by the same factor first).

A ``mask`` ``(B, T)`` column that is False leaves the state unchanged, as in mlx-lm.
Its output is 0, as mlx-lm's Metal kernels write it (mlx-lm's CPU ops path returns a
read of the state updated and then discarded; neither reaches a real token). This
package has no Metal kernels: the ``gated_delta_kernel*`` functions compute the
kernels' results, in their output dtypes, with the same recurrence.
"""

import mlx.core as mx
import mlx.nn as nn

from ..layers.gated_delta import gated_delta_rule, l2_normalize


def compute_g(A_log, a, dt_bias):
    """The per-step decay factor ``exp(-exp(A_log) * softplus(a + dt_bias))``."""
    return mx.exp(-mx.exp(A_log.astype(mx.float32)) * nn.softplus(a + dt_bias))


def compute_lower_bound_g(A_log, a, dt_bias, lower_bound):
    """Kimi K3's bounded decay factor ``exp(lower_bound * sigmoid(exp(A_log) * (a +
    dt_bias)))``, in ``(exp(lower_bound), 1)``."""
    rate = mx.exp(A_log.astype(mx.float32))
    return mx.exp(lower_bound * mx.sigmoid(rate * (a.astype(mx.float32) + dt_bias)))


def normalize_qk(q, k, *, inv_scale, eps):
    """L2-normalise ``q`` and ``k`` over the last axis and fold the readout scale in:
    ``q`` ends with norm ``inv_scale ** 2 * sqrt(Dk)``, ``k`` with ``inv_scale *
    sqrt(Dk)`` (1 for the usual ``inv_scale = Dk ** -0.5``). ``eps`` is added to
    ``sum(x ** 2)``, scaled as mlx-lm's ``rms_norm`` form scales it."""
    dk = q.shape[-1]
    norm_eps = eps * inv_scale ** 2 * dk
    root = dk ** 0.5

    def unit(x):
        return l2_normalize(x.astype(mx.float32), norm_eps)

    q_out = (inv_scale ** 2 * root) * unit(q)
    k_out = (inv_scale * root) * unit(k)
    return q_out.astype(q.dtype), k_out.astype(k.dtype)


def gated_delta_ops(q, k, v, g, beta, state=None, mask=None):
    """The gated delta rule with mlx-lm's signature.

    ``q``, ``k``: ``(B, T, Hk, Dk)``; ``v``: ``(B, T, Hv, Dv)``; ``g`` (decay factors):
    ``(B, T, Hv)`` or ``(B, T, Hv, Dk)``; ``beta``: ``(B, T, Hv)``; ``state``:
    ``(B, Hv, Dv, Dk)`` or None (zeros); ``mask``: ``(B, T)`` or None. Returns
    ``(y (B, T, Hv, Dv) in q's dtype, state (B, Hv, Dv, Dk) float32)``."""
    b, t, hk, dk = q.shape
    hv = v.shape[-2]
    if hv > hk:  # each key head serves hv // hk consecutive value heads
        q, k = mx.repeat(q, hv // hk, axis=-2), mx.repeat(k, hv // hk, axis=-2)
    valid = mx.ones((b, t), mx.bool_) if mask is None else mask.astype(mx.bool_)
    ours = None if state is None else state.astype(mx.float32).swapaxes(-1, -2)
    log_g = mx.log(g.astype(mx.float32))
    y, ours = gated_delta_rule(q.astype(mx.float32) * dk ** 0.5, k, v, log_g, beta, ours, valid)
    y = mx.where(valid[..., None, None], y, 0.0)
    return y.astype(q.dtype), ours.swapaxes(-1, -2)


def gated_delta_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *,
                       use_kernel=True, lower_bound=None, allow_neg_eigval=False):
    """mlx-lm's layer-level entry: ``beta = sigmoid(b)`` (times 2 with
    ``allow_neg_eigval``), the decay from ``compute_g`` (or ``compute_lower_bound_g``),
    then ``gated_delta_ops``. ``q``/``k`` come normalised (``normalize_qk``).
    ``use_kernel`` picks mlx-lm's Metal kernel, whose results are the same."""
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    if lower_bound is None:
        g = compute_g(A_log, a, dt_bias)
    else:
        g = compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    return gated_delta_ops(q, k, v, g, beta, state, mask)


def _as_kernel(q, k, v, g, beta, state, mask):
    """The kernels' contract: ``y`` in ``q``'s dtype, the state in ``state``'s."""
    y, new_state = gated_delta_ops(q, k, v, g, beta, state, mask)
    return y, new_state.astype(state.dtype)


def gated_delta_kernel(q, k, v, g, beta, state, mask=None):
    """mlx-lm's Metal kernel entry (packed where eligible): the same result."""
    return _as_kernel(q, k, v, g, beta, state, mask)


def gated_delta_kernel_unpacked(q, k, v, g, beta, state, mask=None):
    """mlx-lm's one-value-row-per-SIMD-group kernel: the same result."""
    return _as_kernel(q, k, v, g, beta, state, mask)


def gated_delta_kernel_xtree(q, k, v, g, beta, state, mask=None):
    """mlx-lm's explicit-tree comparator kernel (no mask, as there): the same result."""
    if mask is not None:
        raise ValueError("gated_delta_kernel_xtree takes no mask (as in mlx-lm)")
    return _as_kernel(q, k, v, g, beta, state, None)
