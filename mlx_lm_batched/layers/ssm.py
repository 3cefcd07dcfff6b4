"""Shared primitives of recurrent (state-space / linear-attention) layers, exact
under left padding.

Every primitive takes ``valid``, a ``(B, L)`` boolean array (``column_validity``):
False for a column that is padding of its row. A padding column is the identity for
the state: it feeds zeros into the convolution (and never shifts the row's window:
``causal_conv`` moves it before the cached inputs) and a zero step size into the
recurrence (``exp(0 * A) = 1``, ``0 * B x = 0``), so a row's state equals that of the
row run alone, whatever the padding and the prefill chunking. Outputs of padding
columns are meaningless and never reach a real token.
"""

import mlx.core as mx
import mlx.nn as nn

from ..cache.views import ShiftedView
from .mlp import activation


def base_cache(cache):
    """The layer's ``StateCache`` behind a driver view (or ``cache`` itself, or None)."""
    return cache.cache if isinstance(cache, ShiftedView) else cache


def column_validity(cache, offset, length):
    """``(B, length)`` bool, True where column ``c`` of row ``b`` is a real token.

    A column is padding when its position ``offset[b] + c`` is negative (left padding
    of a first prefill) or, on a later turn whose rows start at different columns
    (the driver's ``ShiftedView``), when it is one of the row's first ``shift[b]``."""
    cols = mx.arange(length)[None, :]
    valid = (offset[:, None] + cols) >= 0
    if isinstance(cache, ShiftedView):
        valid = valid & (cols >= cache.shift[:, None])
    return valid


def causal_conv(x, weight, bias, state, valid):
    """Depthwise causal convolution over time of ``x`` ``(B, L, C)``.

    ``weight``: ``(C, K)``; ``state``: the row's last ``K - 1`` inputs ``(B, K-1, C)``
    (None: zeros). Returns ``(y, new_state)``. Each row's padding columns (leading
    within the chunk) are zeroed and moved before its cached inputs, so the window of
    a real column holds exactly the row's previous real inputs."""
    B, L, C = x.shape
    K = weight.shape[1]
    x = mx.where(valid[..., None], x, mx.zeros((), x.dtype))
    if state is None:
        state = mx.zeros((B, K - 1, C), x.dtype)
    seq = mx.concatenate([state.astype(x.dtype), x], axis=1)
    n_pad = (L - valid.sum(axis=1)).astype(mx.int32)[:, None]
    j = mx.arange(K - 1 + L)[None, :]
    idx = mx.where(j < n_pad, K - 1 + j, mx.where(j < K - 1 + n_pad, j - n_pad, j))
    seq = mx.take_along_axis(seq, idx[..., None], axis=1)
    y = seq[:, 0:L] * weight[:, 0]
    for k in range(1, K):
        y = y + seq[:, k : k + L] * weight[:, k]
    if bias is not None:
        y = y + bias
    return y, seq[:, L:]


class CausalConv1d(nn.Module):
    """Depthwise causal ``Conv1d`` with Hugging Face's ``(C, 1, K)`` weight layout."""

    def __init__(self, channels, kernel, bias=True):
        super().__init__()
        self.kernel = kernel
        self.weight = mx.zeros((channels, 1, kernel))
        if bias:
            self.bias = mx.zeros((channels,))

    def __call__(self, x, state, valid):
        bias = self.bias if "bias" in self else None
        return causal_conv(x, self.weight[:, 0, :], bias, state, valid)

    @staticmethod
    def sanitize_weight(w, kernel):
        """Accept mlx-lm's ``(C, K, 1)`` layout as well as Hugging Face's ``(C, 1, K)``."""
        return w.swapaxes(1, 2) if w.ndim == 3 and w.shape[1] == kernel and w.shape[2] == 1 else w


def weightless_rms_norm(x, eps):
    """RMS normalisation without a weight (Falcon-Mamba's B, C and dt norms); the
    fused kernel accumulates in float32 whatever ``x``'s dtype."""
    return mx.fast.rms_norm(x, weight=None, eps=eps)


def selective_scan(x, dt, A, Bm, Cm, D, state, valid):
    """Mamba's selective scan, vectorised over rows, sequential over time.

    ``x``, ``dt``: ``(B, L, Dn)`` (``dt`` after softplus); ``A``: ``(Dn, N)``;
    ``Bm``, ``Cm``: ``(B, L, N)``; ``state``: ``(B, Dn, N)`` or None. Padding columns
    get ``dt = 0``: the identity step. Returns ``(y (B, L, Dn), state)`` in float32."""
    Bsz, L, Dn = x.shape
    x, dt = x.astype(mx.float32), mx.where(valid[..., None], dt.astype(mx.float32), 0.0)
    Bm, Cm = Bm.astype(mx.float32), Cm.astype(mx.float32)
    h = mx.zeros((Bsz, Dn, A.shape[1]), mx.float32) if state is None else state
    dA = mx.exp(dt[..., None] * A)  # (B, L, Dn, N)
    dBx = (dt * x)[..., None] * Bm[:, :, None, :]
    ys = []
    for t in range(L):
        h = dA[:, t] * h + dBx[:, t]
        ys.append((h @ Cm[:, t, :, None])[..., 0])
    y = mx.stack(ys, axis=1) + x * D
    return y, h


def ssd_scan(x, dt, A, Bm, Cm, D, state, valid):
    """Mamba-2's scalar-decay scan (SSD), vectorised over rows and heads.

    ``x``: ``(B, L, H, P)``; ``dt``: ``(B, L, H)`` (after softplus and limits);
    ``A``, ``D``: ``(H,)``; ``Bm``, ``Cm``: ``(B, L, G, N)`` with ``H`` a multiple of
    the ``G`` groups (head ``h`` reads group ``h // (H // G)``); ``state``:
    ``(B, H, P, N)`` or None. Padding columns get ``dt = 0`` (identity step).
    Returns ``(y (B, L, H, P), state)`` in float32."""
    Bsz, L, H, P = x.shape
    reps = H // Bm.shape[2]
    x = x.astype(mx.float32)
    dt = mx.where(valid[..., None], dt.astype(mx.float32), 0.0)
    Bm = mx.repeat(Bm.astype(mx.float32), reps, axis=2)
    Cm = mx.repeat(Cm.astype(mx.float32), reps, axis=2)
    h = mx.zeros((Bsz, H, P, Bm.shape[-1]), mx.float32) if state is None else state
    dA = mx.exp(dt * A)[..., None, None]  # (B, L, H, 1, 1)
    dBx = (dt[..., None] * x)[..., None] * Bm[:, :, :, None, :]  # (B, L, H, P, N)
    ys = []
    for t in range(L):
        h = dA[:, t] * h + dBx[:, t]
        ys.append((h @ Cm[:, t, :, :, None])[..., 0])
    y = mx.stack(ys, axis=1) + x * D[:, None]
    return y, h


class GatedRMSNorm(nn.Module):
    """RMS norm over groups of ``dims // groups`` channels gated by ``silu(gate)``:
    ``weight * rms_norm(x * silu(gate))`` (Mamba-2, ``norm_before_gate=False``) or
    ``weight * rms_norm(x) * silu(gate)`` (Qwen3-Next's linear attention).
    ``gate_act``: the gate's activation (Kimi Linear: ``sigmoid``)."""

    def __init__(self, dims, groups=1, eps=1e-6, norm_before_gate=False, gate_act="silu"):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.groups, self.eps = groups, eps
        self.norm_before_gate = norm_before_gate
        self._gate_act = activation(gate_act)

    def __call__(self, x, gate=None):
        dtype = x.dtype
        x = x.astype(mx.float32)
        silu_gate = None if gate is None else self._gate_act(gate.astype(mx.float32))
        if silu_gate is not None and not self.norm_before_gate:
            x = x * silu_gate
        x = self.weight * self._normalize(x).astype(dtype)
        if silu_gate is not None and self.norm_before_gate:
            x = (x * silu_gate).astype(dtype)
        return x

    def _normalize(self, x):
        """``x`` (float32) divided by its RMS over each group of channels (the tensor-
        parallel norm overrides this: its groups may span ranks)."""
        shape = x.shape
        x = x.reshape(*shape[:-1], self.groups, -1)
        x = x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return x.reshape(shape)


class ShortConv(nn.Module):
    """LFM2's gated short convolution: ``out(C * conv(B * x))`` with ``B, C, x`` from
    one input projection; its ``StateCache`` holds the last ``kernel - 1`` inputs."""

    def __init__(self, hidden_size, kernel, bias=False):
        super().__init__()
        self.in_proj = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.conv = CausalConv1d(hidden_size, kernel, bias=bias)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)


    def __call__(self, x, mask, offset, cache=None, attention=None):
        valid = column_validity(cache, offset, x.shape[1])
        state = base_cache(cache)
        b, c, h = mx.split(self.in_proj(x), 3, axis=-1)
        y, conv_state = self.conv(b * h, None if state is None else state[0], valid)
        if state is not None:
            state[0] = conv_state
            state.advance(x.shape[1])
        return self.out_proj(c * y)


class HybridBlock(nn.Module):
    """Pre-norm block around any mixer (attention or a recurrent layer) and an
    optional MLP: ``h = x + mixer(norm1(x)); out = h + mlp(norm2(h))``.

    ``names``: the checkpoint's names for (mixer, mlp, norm1, norm2); a mixer takes
    ``(x, mask, offset, cache, attention)`` like the shared ``Attention``."""

    def __init__(self, mixer, mlp, norm, names=("self_attn", "mlp", "input_layernorm",
                                                 "post_attention_layernorm")):
        super().__init__()
        self.names = tuple(names)
        setattr(self, names[0], mixer)
        setattr(self, names[2], norm())
        if mlp is not None:
            setattr(self, names[1], mlp)
            setattr(self, names[3], norm())
        self.has_mlp = mlp is not None

    def __call__(self, x, mask, offset, cache=None, attention=None):
        mixer, mlp, norm1, norm2 = self.names
        h = x + getattr(self, mixer)(getattr(self, norm1)(x), mask, offset, cache, attention)
        if not self.has_mlp:
            return h
        return h + getattr(self, mlp)(getattr(self, norm2)(h))



class NormedResidualBlock(nn.Module):
    """MiniMax's block: each residual is the *normed* input, and each sum weighs the
    residual and the branch: ``n1 = norm1(x); h = a1 * n1 + b1 * mixer(n1);
    n2 = norm2(h); out = a2 * n2 + b2 * mlp(n2)``. ``factors``: ``(a1, b1, a2, b2)``;
    ``names`` as :class:`HybridBlock`'s."""

    def __init__(self, mixer, mlp, norm, factors, names=("self_attn", "mlp", "input_layernorm",
                                                         "post_attention_layernorm")):
        super().__init__()
        self.names = tuple(names)
        for name, module in zip(self.names, (mixer, mlp, norm(), norm())):
            setattr(self, name, module)
        self.factors = tuple(float(f) for f in factors)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        mixer, mlp, norm1, norm2 = (getattr(self, n) for n in self.names)
        a1, b1, a2, b2 = self.factors
        n = norm1(x)
        h = n * a1 + mixer(n, mask, offset, cache, attention) * b1
        n = norm2(h)
        return n * a2 + mlp(n) * b2


def rg_lru_scan(x, log_a, positions, state, valid):
    """Griffin's RG-LRU recurrence ``h = a * h + sqrt(1 - a^2) * x`` (reset at position
    0: ``h = x``), vectorised over rows, sequential over time.

    ``x``: ``(B, L, W)`` gated inputs; ``log_a``: ``(B, L, W)`` log of the recurrent
    gate; ``positions``: ``(B, L)``; ``state``: ``(B, W)`` or None. Padding columns keep
    the state (``a = 1``, no input). Returns ``(y (B, L, W) float32, state)``."""
    B, L, W = x.shape
    log_a = log_a.astype(mx.float32)
    reset = (positions == 0)[..., None]
    keep = valid[..., None]
    scale = mx.where(reset, 1.0, mx.sqrt(mx.maximum(1.0 - mx.exp(2 * log_a), 0.0)))
    x = mx.where(keep, x.astype(mx.float32) * scale, 0.0)
    a = mx.where(keep & ~reset, mx.exp(log_a), mx.where(keep, 0.0, 1.0))
    h = mx.zeros((B, W), mx.float32) if state is None else state
    ys = []
    for t in range(L):
        h = a[:, t] * h + x[:, t]
        ys.append(h)
    return mx.stack(ys, axis=1), h
