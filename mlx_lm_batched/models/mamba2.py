"""Mamba-2: Mamba's block with the SSD mixer (per-head scalar decay, grouped B/C,
gated RMS norm); one ``StateCache`` (conv inputs, SSM state) per layer."""

from dataclasses import dataclass
from typing import Optional, Union

import mlx.core as mx
import mlx.nn as nn

from . import mamba
from .ssm import CausalConv1d, GatedRMSNorm, base_cache, column_validity, ssd_scan


@dataclass
class ModelArgs(mamba.ModelArgs):
    num_heads: int = 128
    head_dim: int = 64
    n_groups: int = 8
    state_size: int = 128
    time_step_limit: Optional[Union[list, tuple]] = None
    tie_word_embeddings: bool = False


def _as_float(value):
    """A config number; transformers 5 writes infinity as ``{"__float__": "Infinity"}``."""
    return float(value["__float__"]) if isinstance(value, dict) else float(value)


class Mamba2Mixer(nn.Module):
    def __init__(self, args):
        super().__init__()
        D, N, G, H = args.intermediate_size, args.state_size, args.n_groups, args.num_heads
        if H * args.head_dim != D:
            raise ValueError(f"num_heads * head_dim ({H * args.head_dim}) must equal "
                             f"expand * hidden_size ({D})")
        self.sizes = (D, N, G, H, args.head_dim)
        conv_dim = D + 2 * G * N
        self.in_proj = nn.Linear(args.hidden_size, D + conv_dim + H, bias=args.use_bias)
        self.conv1d = CausalConv1d(conv_dim, args.conv_kernel, bias=args.use_conv_bias)
        self.dt_bias = mx.ones((H,))
        self.A_log = mx.zeros((H,))
        self.D = mx.ones((H,))
        self.norm = GatedRMSNorm(D, groups=G, eps=args.layer_norm_epsilon)
        self.out_proj = nn.Linear(D, args.hidden_size, bias=args.use_bias)
        low, high = args.time_step_limit or (0.0, float("inf"))
        self._dt_limit = (_as_float(low), _as_float(high))

    def __call__(self, x, offset, cache=None):
        D, N, G, H, P = self.sizes
        Bsz, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        conv_state, ssm_state = (None, None) if state is None else (state[0], state[1])
        gate, xbc, dt = mx.split(self.in_proj(x), [D, 2 * D + 2 * G * N], axis=-1)
        xbc, conv_state = self.conv1d(xbc, conv_state, valid)
        xbc = nn.silu(xbc)
        xs, Bm, Cm = mx.split(xbc, [D, D + G * N], axis=-1)
        dt = nn.softplus(dt.astype(mx.float32) + self.dt_bias)
        dt = mx.clip(dt, *self._dt_limit)
        A = -mx.exp(self.A_log.astype(mx.float32))
        y, ssm_state = ssd_scan(xs.reshape(Bsz, L, H, P), dt, A, Bm.reshape(Bsz, L, G, N),
                                Cm.reshape(Bsz, L, G, N), self.D, ssm_state, valid)
        y = self.norm(y.reshape(Bsz, L, D).astype(x.dtype), gate)
        if state is not None:
            state[0], state[1] = conv_state, ssm_state
            state.advance(L)
        return self.out_proj(y)


class Model(mamba.Model):
    def __init__(self, args):
        super().__init__(args, Mamba2Mixer)
