"""RWKV-7 ("Goose") time mixing and channel mixing, exact under padding.

Both mix each token with the row's *previous real token* (token shift), and the time
mixing runs the generalised delta rule on a per-head ``(Dv, Dk)`` state ``S``:
``S = S * diag(w) + v k^T + (S a) b^T; y = S r``. A padding column is the identity for
every state: the token shift skips it (``ssm.causal_conv``'s reordering, a kernel of
two taps that picks the previous input), and its delta-rule step has ``w = 1``,
``k = 0`` and ``b = 0`` (``S`` unchanged). A layer's ``StateCache`` holds
``[time-mix shift (B, 1, C), delta-rule state (B, H, Dv, Dk), channel-mix shift]``.
"""

import mlx.core as mx
import mlx.nn as nn

from .norms import HeadwiseLayerNorm, LayerNorm
from .ssm import base_cache, causal_conv, column_validity

# The previous input (tap 0) and not the current one (tap 1): a token shift as a
# two-tap causal convolution, so it shares causal_conv's padding handling.
_SHIFT_TAPS = mx.array([[1.0, 0.0]])

# RWKV-7's decay: w = exp(-exp(-0.5) * sigmoid(w_lora(x))), each factor in (0.545, 1).
_DECAY_SCALE = 0.606531


def token_shift(x, state, valid):
    """``(x_prev (B, L, C), new_state (B, 1, C))``: each column's previous real input of
    its row (``state``, the last real input of the previous call, or zeros)."""
    return causal_conv(x, _SHIFT_TAPS.astype(x.dtype), None, state, valid)


def wkv7(r, w, k, v, a, b, state, valid):
    """RWKV-7's delta rule, vectorised over rows and heads, sequential over time.

    ``r, w, k, v, a, b``: ``(B, L, H, D)``; ``state``: ``(B, H, Dv, Dk)`` or None;
    ``valid``: ``(B, L)`` (False: padding, the identity step). Returns
    ``(y (B, L, H, Dv), state)`` in float32."""
    B, L, H, D = k.shape
    keep = valid[:, :, None, None]
    r, v, a = (t.astype(mx.float32) for t in (r, v, a))
    w = mx.where(keep, w.astype(mx.float32), 1.0)
    k = mx.where(keep, k.astype(mx.float32), 0.0)
    b = mx.where(keep, b.astype(mx.float32), 0.0)
    S = mx.zeros((B, H, D, D), mx.float32) if state is None else state
    ys = []
    for t in range(L):
        Sa = (S @ a[:, t, :, :, None])  # (B, H, Dv, 1)
        S = (S * w[:, t, :, None, :] + v[:, t, :, :, None] * k[:, t, :, None, :]
             + Sa * b[:, t, :, None, :])
        ys.append((S @ r[:, t, :, :, None])[..., 0])
    return mx.stack(ys, axis=1), S


_ACTIVATIONS = {None: lambda x: x, "tanh": mx.tanh, "sigmoid": mx.sigmoid}


class LowRank(nn.Module):
    """``lora.2(act(lora.0(x)))`` (RWKV-7's low-rank projections, their names)."""

    def __init__(self, dims, rank, activation=None, bias=True):
        super().__init__()
        self.lora = [nn.Linear(dims, rank, bias=False), nn.Identity(),
                     nn.Linear(rank, dims, bias=bias)]
        self.activation = activation

    def __call__(self, x):
        return self.lora[2](_ACTIVATIONS[self.activation](self.lora[0](x)))


class TimeMixing(nn.Module):
    """RWKV-7's attention: token-shift interpolations per projection, low-rank decay,
    in-context learning rate, value residual (from layer 0's values) and gate; the
    delta rule; a per-head group norm; a bonus ``(r * k * r_k) v`` per head."""

    def __init__(self, hidden_size, head_dim, layer_idx, ranks, eps):
        """``ranks``: ``(decay, a, v, gate)`` low-rank widths; ``eps`` the group norm's."""
        super().__init__()
        H, D = hidden_size // head_dim, head_dim
        self.sizes = (H, D)
        self.layer_idx = layer_idx
        for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            setattr(self, name, mx.zeros((1, 1, hidden_size)))
        for name in ("k_k", "k_a", "r_k"):
            setattr(self, name, mx.zeros((H, D)))
        for name in ("r_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, nn.Linear(hidden_size, hidden_size, bias=False))
        self.g_norm = HeadwiseLayerNorm(H, D, eps=eps, bias=True)
        decay, a, v, gate = ranks
        self.w_lora = LowRank(hidden_size, decay, "tanh")
        if layer_idx > 0:
            self.v_lora = LowRank(hidden_size, v)
        self.a_lora = LowRank(hidden_size, a)
        self.g_lora = LowRank(hidden_size, gate, "sigmoid", bias=False)

    def __call__(self, x, v_first, valid, state):
        """``(out, v_first)``; ``state``: the layer's ``StateCache`` or None (updated
        here, slots counted by the caller)."""
        H, D = self.sizes
        B, L, C = x.shape
        heads = lambda t: t.reshape(B, L, H, D)
        x_prev, shift = token_shift(x, None if state is None else state[0], valid)
        xx = x_prev - x
        xr, xw, xk, xv, xa, xg = (x + xx * self[n] for n in
                                  ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"))
        r, k, v = heads(self.r_proj(xr)), heads(self.k_proj(xk)), heads(self.v_proj(xv))
        iclr = heads(mx.sigmoid(self.a_lora(xa)))
        if self.layer_idx == 0:
            v_first = v
        else:
            v = v + (v_first - v) * heads(mx.sigmoid(self.v_lora(xv)))
        w = mx.exp(-_DECAY_SCALE * mx.sigmoid(heads(self.w_lora(xw)).astype(mx.float32)))
        kk = k * self.k_k
        kk = kk / mx.maximum(mx.linalg.norm(kk, axis=-1, keepdims=True), 1e-7)
        k = k * (1 + (iclr - 1) * self.k_a)
        y, S = wkv7(r, w, k, v, -kk, kk * iclr, None if state is None else state[1], valid)
        out = self.g_norm(y.astype(x.dtype).reshape(B, L, C)).reshape(B, L, H, D)
        out = out + (r * k * self.r_k).sum(axis=-1, keepdims=True) * v
        if state is not None:
            state[0], state[1] = shift, S
        return self.o_proj(out.reshape(B, L, C) * self.g_lora(xg)), v_first


class ChannelMixing(nn.Module):
    """RWKV-7's feed-forward: ``value(relu(key(x + (x_prev - x) * x_k))^2)``."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.key = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.value = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.x_k = mx.zeros((hidden_size,))

    def __call__(self, x, valid, state):
        x_prev, shift = token_shift(x, None if state is None else state[2], valid)
        if state is not None:
            state[2] = shift
        h = mx.maximum(self.key(x + (x_prev - x) * self.x_k), 0)
        return self.value(h * h)


class Rwkv7Block(nn.Module):
    """One RWKV-7 layer (``pre_norm`` on layer 0 only): ``h = x + attn(attn_norm(x));
    out = h + ffn(ffn_norm(h))``; layer 0's values travel to the others (``v_first``)."""

    def __init__(self, hidden_size, intermediate_size, head_dim, layer_idx, ranks, eps,
                 group_norm_eps):
        super().__init__()
        norm = lambda: LayerNorm(hidden_size, eps)
        if layer_idx == 0:
            self.pre_norm = norm()
        self.attn = TimeMixing(hidden_size, head_dim, layer_idx, ranks, group_norm_eps)
        self.ffn = ChannelMixing(hidden_size, intermediate_size)
        self.attn_norm, self.ffn_norm = norm(), norm()

    def __call__(self, x, v_first, offset, cache=None):
        valid = column_validity(cache, offset, x.shape[1])
        state = base_cache(cache)
        if "pre_norm" in self:
            x = self.pre_norm(x)
        h, v_first = self.attn(self.attn_norm(x), v_first, valid, state)
        h = x + h
        out = h + self.ffn(self.ffn_norm(h), valid, state)
        if state is not None:
            state.advance(x.shape[1])
        return out, v_first
