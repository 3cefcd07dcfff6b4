"""PLaMo 2 (Preferred Networks): Mamba-2-style SSM layers (``StateCache``) alternating
with attention layers (``KVCache``; the ones not in ``full_attention_idx`` windowed to
``attention_window_size``), each mixer and MLP wrapped in a pre- and a post-norm whose
weights are stored as offsets (``weight + 1``, ``+ 1/5`` after the mixer,
``+ 1/5**1.5`` after the MLP).

The SSM: ``in_proj`` gives each head's gate then its input; a causal convolution and
SiLU; B, C (one group) and a low-rank dt from ``bcdt_proj``, each RMS-normed with its
own weight; the scalar-decay scan (``ssm.ssd_scan``, dt clipped to [0.001, 100]);
``silu(gate) * y``. Attention: one ``qkv_proj``, per-head RMS QK-norm with ``(heads,
head_dim)`` weights (``q_weight``/``k_weight``), RoPE (theta 10000)."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.ssm import CausalConv1d, base_cache, column_validity, ssd_scan
from ..layers.stack import CausalLM
from .common import StackArgs, init_causal_lm

DT_LIMIT = (0.001, 100.0)
QK_NORM_EPS = 1e-6
NORM_OFFSETS = {"pre_mixer_norm": 1.0, "post_mixer_norm": 1.0 / 5,
                "pre_mlp_norm": 1.0, "post_mlp_norm": 1.0 / 5**1.5}


@dataclass
class ModelArgs(StackArgs):
    # mlx-lm's (PLaMo 2 8B's) defaults for fields a config may omit.
    model_type: str = "plamo2"
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    hidden_size_per_head: int = 128
    max_position_embeddings: int = 2048
    attention_window_size: int = 2048
    full_attention_idx: Optional[List[int]] = None
    mamba_d_state: int = 64
    mamba_d_conv: int = 4
    mamba_num_heads: int = 64
    mamba_step: int = 2
    mamba_chunk_size: int = 256
    mamba_enabled: bool = True
    intermediate_size: int = 13312
    vocab_size: int = 32000

    def is_mamba(self, i):
        """PLaMo 2's layout: every ``mamba_step``-th layer (from ``mamba_step // 2``) is
        attention; a stack shorter than that has attention in its last layer only."""
        if not self.mamba_enabled:
            return False
        if self.num_hidden_layers <= self.mamba_step // 2:
            return i != self.num_hidden_layers - 1
        return i % self.mamba_step != self.mamba_step // 2

    def window(self, i):
        """Attention layer ``i``'s window: None for the ``full_attention_idx`` layers."""
        if self.full_attention_idx is None or i in self.full_attention_idx:
            return None
        return self.attention_window_size


class OffsetRMSNorm(RMSNorm):
    """RMS norm scaled by ``weight + offset`` (the checkpoint stores the difference)."""

    def __init__(self, dims, eps, offset):
        super().__init__(dims, eps, zero_centered=True)
        self.offset = offset

    def __call__(self, x):
        return mx.fast.rms_norm(x, self.weight + self.offset, self.eps)


class PlamoAttention(Attention):
    """The shared attention with one ``qkv_proj`` and PLaMo's QK-norm: a weightless RMS
    norm of each head times its row of ``q_weight``/``k_weight`` ``(heads, head_dim)``."""

    def __init__(self, args, rope):
        D = args.hidden_size_per_head
        super().__init__(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                         D, rope, projections=Projections(fused_qkv=True))
        self.q_weight = mx.ones((args.num_attention_heads, D))
        self.k_weight = mx.ones((args.num_key_value_heads, D))

    def _heads(self, t, which, offset):
        B, L, _ = t.shape
        weight = self.k_weight if which else self.q_weight
        t = mx.fast.rms_norm(t.reshape(B, L, weight.shape[0], -1), None, QK_NORM_EPS) * weight
        return self.rope(t.transpose(0, 2, 1, 3), offset)


class Mamba(nn.Module):
    """PLaMo 2's SSM mixer; its ``StateCache`` holds ``[conv inputs, SSM state]``."""

    def __init__(self, args):
        super().__init__()
        H, P, N = args.mamba_num_heads, args.hidden_size_per_head, args.mamba_d_state
        R = max(64, args.hidden_size // 16)
        self.sizes = (H, P, N, R)
        self.eps = args.rms_norm_eps
        self.in_proj = nn.Linear(args.hidden_size, 2 * H * P, bias=False)
        self.conv1d = CausalConv1d(H * P, args.mamba_d_conv, bias=False)
        self.bcdt_proj = nn.Linear(H * P, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, H, bias=False)
        self.dt_bias = mx.zeros((H,))
        self.A_log = mx.zeros((H,))
        self.D = mx.ones((H,))
        self.dt_norm_weight = mx.ones((R,))
        self.B_norm_weight = mx.ones((N,))
        self.C_norm_weight = mx.ones((N,))
        self.out_proj = nn.Linear(H * P, args.hidden_size, bias=False)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        H, P, N, R = self.sizes
        B, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        zx = self.in_proj(x).reshape(B, L, H, 2 * P)
        z, xs = zx[..., :P].reshape(B, L, H * P), zx[..., P:].reshape(B, L, H * P)
        xs, conv_state = self.conv1d(xs, None if state is None else state[0], valid)
        xs = nn.silu(xs)
        Bm, Cm, dt = mx.split(self.bcdt_proj(xs), [N, 2 * N], axis=-1)
        dt = mx.fast.rms_norm(dt, self.dt_norm_weight, self.eps)
        Bm = mx.fast.rms_norm(Bm, self.B_norm_weight, self.eps)
        Cm = mx.fast.rms_norm(Cm, self.C_norm_weight, self.eps)
        dt = nn.softplus(self.dt_proj(dt).astype(mx.float32) + self.dt_bias)
        dt = mx.clip(dt, *DT_LIMIT)
        A = -mx.exp(self.A_log.astype(mx.float32))
        y, ssm_state = ssd_scan(xs.reshape(B, L, H, P), dt, A, Bm.reshape(B, L, 1, N),
                                Cm.reshape(B, L, 1, N), self.D, None if state is None
                                else state[1], valid)
        if state is not None:
            state[0], state[1] = conv_state, ssm_state
            state.advance(L)
        y = (nn.silu(z.astype(mx.float32)) * y.reshape(B, L, H * P)).astype(x.dtype)
        return self.out_proj(y)


class PlamoBlock(nn.Module):
    """``h = x + post_mixer_norm(mixer(pre_mixer_norm(x)));
    out = h + post_mlp_norm(mlp(pre_mlp_norm(h)))``."""

    def __init__(self, mixer, mlp, dims, eps):
        super().__init__()
        self.mixer, self.mlp = mixer, mlp
        for name, offset in NORM_OFFSETS.items():
            setattr(self, name, OffsetRMSNorm(dims, eps, offset))

    def __call__(self, x, mask, offset, cache=None, attention=None):
        h = x + self.post_mixer_norm(self.mixer(self.pre_mixer_norm(x), mask, offset, cache,
                                                attention))
        return h + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(h)))


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = make_rope(args.hidden_size_per_head, 10000.0)
        layers = []
        for i in range(args.num_hidden_layers):
            mixer = Mamba(args) if args.is_mamba(i) else PlamoAttention(args, rope)
            mlp = MLP(args.hidden_size, args.intermediate_size, "silu", fused_gate_up=True)
            layers.append(PlamoBlock(mixer, mlp, args.hidden_size, args.rms_norm_eps))
        windows = [None if args.is_mamba(i) else args.window(i)
                   for i in range(args.num_hidden_layers)]
        init_causal_lm(self, args, layers, OffsetRMSNorm(args.hidden_size, args.rms_norm_eps,
                                                         1.0), windows)

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per SSM layer, the shared key/value caches for attention."""
        caches = super().make_cache(max_kv_size)
        return [StateCache(2) if self.args.is_mamba(i) else c for i, c in enumerate(caches)]

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        out = {}
        for k, v in weights.items():
            if k.startswith("model.layers.layers."):  # PLaMo's nested decoder
                k = "model.layers." + k[len("model.layers.layers."):]
            if k.endswith("conv1d.weight"):
                v = CausalConv1d.sanitize_weight(v, self.args.mamba_d_conv)
            out[k] = v
        return out
