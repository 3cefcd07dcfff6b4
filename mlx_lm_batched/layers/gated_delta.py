"""Gated delta-rule linear attention (Qwen3-Next, Qwen3.5), exact under padding.

The state of a head is a ``(Dk, Dv)`` matrix ``S``; each token decays it by
``exp(g)``, then writes ``beta * (v - S^T k)`` along ``k``, and reads ``S^T q``. A padding
column gets ``g = 0`` and ``beta = 0``: ``S`` is unchanged (the identity step). A short
causal convolution over q, k and v precedes it, with its own state (``ssm.causal_conv``).
"""

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .part_checks import require_positive_integers
from .ssm import CausalConv1d, GatedRMSNorm, base_cache, column_validity


def l2_normalize(x, eps=1e-6):
    return x * mx.rsqrt(mx.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_delta_rule(q, k, v, g, beta, state, valid):
    """Run the recurrence, vectorised over rows and heads, sequential over time.

    ``q``, ``k``: ``(B, L, Hv, Dk)`` (already repeated to the value heads and
    L2-normalised); ``v``: ``(B, L, Hv, Dv)``; ``beta``: ``(B, L, Hv)``; ``g`` (log
    decay): ``(B, L, Hv)`` per head, or ``(B, L, Hv, Dk)`` per key channel (Kimi);
    ``state``: ``(B, Hv, Dk, Dv)`` or None. Returns ``(out (B, L, Hv, Dv), state)``
    in float32."""
    B, L, H, Dk = k.shape
    q = q.astype(mx.float32) * (Dk ** -0.5)
    k, v = k.astype(mx.float32), v.astype(mx.float32)
    keep = valid[..., None]
    if g.ndim == 4:  # per key channel: decays the rows of each head's state
        decay = mx.exp(mx.where(keep[..., None], g.astype(mx.float32), 0.0))[..., None]
    else:
        decay = mx.exp(mx.where(keep, g.astype(mx.float32), 0.0))[..., None, None]
    beta = mx.where(keep, beta.astype(mx.float32), 0.0)[..., None]
    S = mx.zeros((B, H, Dk, v.shape[-1]), mx.float32) if state is None else state
    outs = []
    for t in range(L):
        S = S * decay[:, t]
        kt = k[:, t]
        memory = (S * kt[..., None]).sum(axis=-2)  # (B, H, Dv)
        delta = (v[:, t] - memory) * beta[:, t]
        S = S + kt[..., None] * delta[..., None, :]
        outs.append((S * q[:, t][..., None]).sum(axis=-2))
    return mx.stack(outs, axis=1), S


@dataclass(frozen=True)
class DeltaHeads:
    """The heads of gated delta-rule attention: ``n_k_heads`` query/key heads of
    ``k_dim`` features, ``n_v_heads`` value heads of ``v_dim`` (each key head serves
    ``n_v_heads // n_k_heads`` value heads)."""

    n_k_heads: int
    n_v_heads: int
    k_dim: int
    v_dim: int

    def __post_init__(self):
        require_positive_integers(self)

    @property
    def sizes(self):
        """``(n_k_heads, n_v_heads, k_dim, v_dim)``."""
        return (self.n_k_heads, self.n_v_heads, self.k_dim, self.v_dim)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's and Qwen3.5's linear-attention layer: projections, conv, gated
    delta rule, gated RMS norm per value head, output projection. Its ``StateCache``
    holds ``[conv inputs, delta state]``.

    ``fused``: Qwen3-Next's ``in_proj_qkvz``/``in_proj_ba`` (grouped per key head);
    else Qwen3.5's separate ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``.
    ``beta_scale``: ``beta = beta_scale * sigmoid(b)`` (OLMo hybrid's negative
    eigenvalues: 2, beta in [0, 2])."""

    def __init__(self, hidden_size, heads, kernel, eps, fused=True, beta_scale=1.0):
        """``heads``: the :class:`DeltaHeads`; ``kernel``: the convolution's width;
        ``eps``: the gated norm's."""
        super().__init__()
        if not isinstance(heads, DeltaHeads):
            raise ValueError(f"GatedDeltaNet heads must be a DeltaHeads, got {heads!r}")
        n_k_heads, n_v_heads, k_dim, v_dim = heads.sizes
        self.beta_scale = beta_scale
        self.sizes = heads.sizes
        self.fused = fused
        key_dim, value_dim = n_k_heads * k_dim, n_v_heads * v_dim
        if fused:
            self.in_proj_qkvz = nn.Linear(hidden_size, 2 * key_dim + 2 * value_dim, bias=False)
            self.in_proj_ba = nn.Linear(hidden_size, 2 * n_v_heads, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(hidden_size, 2 * key_dim + value_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden_size, value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden_size, n_v_heads, bias=False)
            self.in_proj_a = nn.Linear(hidden_size, n_v_heads, bias=False)
        self.conv1d = CausalConv1d(2 * key_dim + value_dim, kernel, bias=False)
        self.dt_bias = mx.ones((n_v_heads,))
        self.A_log = mx.zeros((n_v_heads,))
        self.norm = GatedRMSNorm(v_dim, eps=eps, norm_before_gate=True)
        self.out_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def project(self, x):
        """``(qkv (B, L, 2*Kd + Vd), z (B, L, Hv, Dv), b, a (B, L, Hv))``."""
        Hk, Hv, Dk, Dv = self.sizes
        B, L, _ = x.shape
        if not self.fused:
            z = self.in_proj_z(x).reshape(B, L, Hv, Dv)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        r = Hv // Hk
        qkvz = self.in_proj_qkvz(x).reshape(B, L, Hk, 2 * Dk + 2 * r * Dv)
        q, k, v, z = mx.split(qkvz, [Dk, 2 * Dk, 2 * Dk + r * Dv], axis=-1)
        b, a = mx.split(self.in_proj_ba(x).reshape(B, L, Hk, 2 * r), 2, axis=-1)
        qkv = mx.concatenate([q.reshape(B, L, -1), k.reshape(B, L, -1), v.reshape(B, L, -1)], -1)
        return qkv, z.reshape(B, L, Hv, Dv), b.reshape(B, L, Hv), a.reshape(B, L, Hv)


    def __call__(self, x, mask, offset, cache=None, attention=None):
        Hk, Hv, Dk, Dv = self.sizes
        B, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        conv_state, delta_state = (None, None) if state is None else (state[0], state[1])
        qkv, z, b, a = self.project(x)
        qkv, conv_state = self.conv1d(qkv, conv_state, valid)
        qkv = nn.silu(qkv)
        q, k, v = mx.split(qkv, [Hk * Dk, 2 * Hk * Dk], axis=-1)
        q = l2_normalize(q.reshape(B, L, Hk, Dk).astype(mx.float32))
        k = l2_normalize(k.reshape(B, L, Hk, Dk).astype(mx.float32))
        if Hv != Hk:  # each key head serves Hv // Hk consecutive value heads
            q, k = mx.repeat(q, Hv // Hk, axis=2), mx.repeat(k, Hv // Hk, axis=2)
        beta = mx.sigmoid(b.astype(mx.float32))
        if self.beta_scale != 1.0:
            beta = beta * self.beta_scale
        g = -mx.exp(self.A_log.astype(mx.float32)) * nn.softplus(a.astype(mx.float32) + self.dt_bias)
        out, delta_state = gated_delta_rule(q, k, v.reshape(B, L, Hv, Dv), g, beta,
                                            delta_state, valid)
        out = self.norm(out.astype(x.dtype), z)
        if state is not None:
            state[0], state[1] = conv_state, delta_state
            state.advance(L)
        return self.out_proj(out.reshape(B, L, -1))


class KimiDeltaAttention(nn.Module):
    """Kimi Linear's KDA layer: q/k/v projections, conv, a gated delta rule with a
    per-channel forget gate (low-rank ``f_a_proj``/``f_b_proj``), an RMS norm gated by
    ``sigmoid`` of a low-rank output gate. ``StateCache``: ``[conv inputs, state]``.

    ``lower_bound``: the log decay is ``lower_bound * sigmoid(exp(A_log) * (f + dt_bias))``
    (bounded in ``(lower_bound, 0)``; Kimi K3) instead of ``-exp(A_log) * softplus(f +
    dt_bias)``. ``full_rank_gate``: the output gate is one ``g_proj`` (Kimi K3's
    ``use_full_rank_gate``), not the low-rank ``g_a_proj``/``g_b_proj``."""

    def __init__(self, hidden_size, heads, head_dim, kernel, eps, lower_bound=None,
                 full_rank_gate=False):
        super().__init__()
        self.sizes = (heads, head_dim)
        self.lower_bound = lower_bound
        dim = heads * head_dim
        self.q_proj = nn.Linear(hidden_size, dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, dim, bias=False)
        self.conv1d = CausalConv1d(3 * dim, kernel, bias=False)
        self.forget_gate = nn.Module()
        self.forget_gate.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.forget_gate.f_b_proj = nn.Linear(head_dim, dim, bias=False)
        self.forget_gate.dt_bias = mx.zeros((dim,))
        self.forget_gate.A_log = mx.zeros((1, 1, heads, 1))
        self.b_proj = nn.Linear(hidden_size, heads, bias=False)
        if full_rank_gate:
            self.g_proj = nn.Linear(hidden_size, dim, bias=False)
        else:
            self.g_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
            self.g_b_proj = nn.Linear(head_dim, dim, bias=False)
        self.o_norm = GatedRMSNorm(head_dim, eps=eps, norm_before_gate=True, gate_act="sigmoid")
        self.o_proj = nn.Linear(dim, hidden_size, bias=False)


    def __call__(self, x, mask, offset, cache=None, attention=None):
        H, Dk = self.sizes
        B, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        conv_state, delta_state = (None, None) if state is None else (state[0], state[1])
        qkv = mx.concatenate([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=-1)
        qkv, conv_state = self.conv1d(qkv, conv_state, valid)
        q, k, v = (t.reshape(B, L, H, Dk) for t in mx.split(nn.silu(qkv), 3, axis=-1))
        fg = self.forget_gate
        g = fg.f_b_proj(fg.f_a_proj(x)).astype(mx.float32) + fg.dt_bias.astype(mx.float32)
        rate = mx.exp(fg.A_log.astype(mx.float32))
        if self.lower_bound is None:
            g = -rate * nn.softplus(g.reshape(B, L, H, Dk))
        else:
            g = self.lower_bound * mx.sigmoid(rate * g.reshape(B, L, H, Dk))
        beta = mx.sigmoid(self.b_proj(x).astype(mx.float32))
        out, delta_state = gated_delta_rule(l2_normalize(q.astype(mx.float32)),
                                            l2_normalize(k.astype(mx.float32)), v, g, beta,
                                            delta_state, valid)
        gate = self.g_proj(x) if "g_proj" in self else self.g_b_proj(self.g_a_proj(x))
        gate = gate.reshape(B, L, H, Dk)
        out = self.o_norm(out, gate).astype(x.dtype)
        if state is not None:
            state[0], state[1] = conv_state, delta_state
            state.advance(L)
        return self.o_proj(out.reshape(B, L, -1))
