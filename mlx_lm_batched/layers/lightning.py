"""Lightning attention (MiniMax): linear attention with a fixed exponential decay per
head, exact under padding.

The state of a head is a ``(D, D)`` matrix ``S``; each token decays it by
``exp(-slope)`` and adds ``k^T v``, and reads ``q S``. A padding column neither decays
the state nor writes to it (the identity step), so a row's state equals that of the row
run alone, whatever the padding and the prefill chunking. Chunks of ``block`` columns
run as matrix products (decays taken from each row's count of real columns), not one
step per column.
"""

import mlx.core as mx
import mlx.nn as nn

from .mlp import activation
from .norms import RMSNorm
from .ssm import base_cache, column_validity

# transformers' MiniMaxRMSNorm default, used for the attention output whatever
# rms_norm_eps says.
OUTPUT_NORM_EPS = 1e-6


def slope_rates(n_heads, layer_idx, n_layers):
    """Per-head decay rates ``(H,)``: ALiBi-like ``2^(-8h/H)`` scaled down with depth
    (``1 - layer_idx / (n_layers - 1)``, as MiniMax computes it)."""
    base = 1 / (2 ** (8 / n_heads))
    factor = 1 - layer_idx / (n_layers - 1 + 1e-5) + 1e-5
    return mx.power(mx.array(base, mx.float32), mx.arange(1, n_heads + 1).astype(mx.float32)) * factor


def lightning_attention(q, k, v, slope, state, valid, block=256):
    """Decayed linear attention, vectorised over rows and heads, by chunks of ``block``.

    ``q``, ``k``, ``v``: ``(B, H, L, D)``; ``slope``: ``(H,)``; ``state``:
    ``(B, H, D, Dv)`` or None; ``valid``: ``(B, L)`` (False: padding, the identity).
    Returns ``(out (B, H, L, Dv), state)`` in float32."""
    B, H, L, D = k.shape
    q, v = q.astype(mx.float32), v.astype(mx.float32)
    k = mx.where(valid[:, None, :, None], k.astype(mx.float32), 0.0)
    steps = valid.astype(mx.float32)
    S = mx.zeros((B, H, D, v.shape[-1]), mx.float32) if state is None else state
    neg_slope = -slope.astype(mx.float32)[None, :, None]
    outs = []
    for start in range(0, L, block):
        end = min(start + block, L)
        qc, kc, vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        # Log decay from the chunk's start to each column: slope times the real
        # columns so far (a padding column adds none). (B, H, C), all <= 0.
        log_decay = neg_slope * mx.cumsum(steps[:, start:end], axis=1)[:, None, :]
        C = end - start
        causal = mx.tril(mx.ones((C, C), mx.bool_))
        diff = log_decay[..., :, None] - log_decay[..., None, :]  # <= 0 where causal
        weights = (qc @ kc.swapaxes(-1, -2)) * mx.where(causal, mx.exp(mx.where(causal, diff, 0.0)), 0.0)
        outs.append(weights @ vc + (qc * mx.exp(log_decay)[..., None]) @ S)
        last = log_decay[..., -1:]
        S = mx.exp(last)[..., None] * S + (kc * mx.exp(last - log_decay)[..., None]).swapaxes(-1, -2) @ vc
    return mx.concatenate(outs, axis=2), S


class LightningAttention(nn.Module):
    """MiniMax's linear-attention layer: ``act(qkv_proj(x))`` split per head into q, k,
    v; lightning attention; an RMS norm over all heads; ``sigmoid(output_gate(x))``;
    ``out_proj``. Its ``StateCache`` holds ``[state (B, H, D, D)]``."""

    def __init__(self, hidden_size, n_heads, head_dim, layer_idx, n_layers, act="silu",
                 block=256):
        super().__init__()
        self.n_heads, self.head_dim, self.block = n_heads, head_dim, block
        dim = n_heads * head_dim
        self.qkv_proj = nn.Linear(hidden_size, 3 * dim, bias=False)
        self.output_gate = nn.Linear(hidden_size, dim, bias=False)
        self.out_proj = nn.Linear(dim, hidden_size, bias=False)
        self.norm = RMSNorm(dim, OUTPUT_NORM_EPS)
        self.act = activation(act)
        self._slope = slope_rates(n_heads, layer_idx, n_layers)  # not a parameter


    def __call__(self, x, mask, offset, cache=None, attention=None):
        B, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        qkv = self.act(self.qkv_proj(x)).reshape(B, L, self.n_heads, 3 * self.head_dim)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in mx.split(qkv, 3, axis=-1))
        out, new_state = lightning_attention(q, k, v, self._slope,
                                             None if state is None else state[0], valid,
                                             self.block)
        if state is not None:
            state[0] = new_state
            state.advance(L)
        out = self.norm(out.transpose(0, 2, 1, 3).reshape(B, L, -1).astype(x.dtype))
        return self.out_proj(mx.sigmoid(self.output_gate(x)) * out)
