"""Mamba-2: Mamba's block with the SSD mixer (per-head scalar decay, grouped B/C,
gated RMS norm); one ``StateCache`` (conv inputs, SSM state) per layer."""

from dataclasses import dataclass
from typing import Optional, Union

import mlx.core as mx
import mlx.nn as nn

from ..layers.part_checks import require_positive_integers
from ..layers.ssm import (
    CausalConv1d,
    GatedRMSNorm,
    base_cache,
    column_validity,
    ssd_scan,
)
from . import mamba
from .args import require_values


@dataclass
class ModelArgs(mamba.ModelArgs):
    num_heads: int = 128
    head_dim: int = 64
    n_groups: int = 8
    state_size: int = 128
    time_step_limit: Optional[Union[list, tuple]] = None
    tie_word_embeddings: bool = False
    ssm_state_size: Optional[int] = None  # mlx-lm's name of state_size
    max_position_embeddings: Optional[int] = None  # no positions in Mamba-2: informational

    def __post_init__(self):
        super().__post_init__()
        self.state_size = self.ssm_state_size or self.state_size
        require_values(self, use_bcdt_rms=(False,))  # Mamba's dt/B/C norms, not Mamba-2's


def _as_float(value):
    """A config number; transformers 5 writes infinity as ``{"__float__": "Infinity"}``."""
    return float(value["__float__"]) if isinstance(value, dict) else float(value)


@dataclass(frozen=True)
class SSDDims:
    """The widths of Mamba-2's SSD: ``heads`` of ``head_dim`` channels, ``state_size``
    states shared by the heads of each of ``groups`` groups, the convolution's
    ``kernel``."""

    heads: int
    head_dim: int
    state_size: int
    groups: int
    kernel: int

    def __post_init__(self):
        require_positive_integers(self)


@dataclass(frozen=True)
class SSDOutput:
    """How the scan's output becomes the mixer's: ``rms_norm``, a gated RMS norm
    (``norm_before_gate``: norm, then gate; else gate, then norm) or else
    ``y * silu(gate)``; ``bias``: ``out_proj``'s (None: the input projection's)."""

    rms_norm: bool = True
    norm_before_gate: bool = False
    bias: Optional[bool] = None


class Mamba2Mixer(nn.Module):
    """Mamba-2's SSD mixer over ``heads * head_dim`` channels (also Nemotron-H's,
    Granite 4's and Falcon-H1's); ``from_args`` reads Mamba-2's config names."""

    def __init__(self, hidden_size, dims, eps, bias=False, conv_bias=True, dt_limit=None,
                 output=SSDOutput(), in_scale=None):
        """``dims``: the :class:`SSDDims`; ``eps``: the output norm's; ``bias``: of
        ``in_proj``; ``conv_bias``: of the convolution; ``dt_limit``: ``(low, high)``
        clip of the time step; ``output``: an :class:`SSDOutput`; ``in_scale``: a
        vector multiplying the input projection (Falcon-H1's MuP multipliers)."""
        super().__init__()
        if not isinstance(dims, SSDDims):
            raise ValueError(f"Mamba2Mixer dims must be an SSDDims, got {dims!r}")
        if not isinstance(output, SSDOutput):
            raise ValueError(f"Mamba2Mixer output must be an SSDOutput, got {output!r}")
        heads, head_dim, kernel = dims.heads, dims.head_dim, dims.kernel
        rms_norm, norm_before_gate, out_bias = output.rms_norm, output.norm_before_gate, output.bias
        D, N, G, H = heads * head_dim, dims.state_size, dims.groups, heads
        self.sizes = (D, N, G, H, head_dim)
        conv_dim = D + 2 * G * N
        self.in_proj = nn.Linear(hidden_size, D + conv_dim + H, bias=bias)
        self.conv1d = CausalConv1d(conv_dim, kernel, bias=conv_bias)
        self.dt_bias = mx.ones((H,))
        self.A_log = mx.zeros((H,))
        self.D = mx.ones((H,))
        if rms_norm:
            self.norm = GatedRMSNorm(D, groups=G, eps=eps, norm_before_gate=norm_before_gate)
        self.out_proj = nn.Linear(D, hidden_size, bias=bias if out_bias is None else out_bias)
        self._in_scale = in_scale  # not a parameter (leading underscore)
        low, high = dt_limit or (0.0, float("inf"))
        self._dt_limit = (_as_float(low), _as_float(high))

    @classmethod
    def from_args(cls, args):
        if args.num_heads * args.head_dim != args.intermediate_size:
            raise ValueError(f"num_heads * head_dim ({args.num_heads * args.head_dim}) must "
                             f"equal expand * hidden_size ({args.intermediate_size})")
        dims = SSDDims(args.num_heads, args.head_dim, args.state_size, args.n_groups,
                       args.conv_kernel)
        return cls(args.hidden_size, dims, args.layer_norm_epsilon, args.use_bias,
                   args.use_conv_bias, args.time_step_limit)


    def __call__(self, x, mask, offset, cache=None, attention=None):
        D, N, G, H, P = self.sizes
        Bsz, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        conv_state, ssm_state = (None, None) if state is None else (state[0], state[1])
        proj = self.in_proj(x)
        if self._in_scale is not None:
            proj = proj * self._in_scale.astype(proj.dtype)
        gate, xbc, dt = mx.split(proj, [D, 2 * D + 2 * G * N], axis=-1)
        xbc, conv_state = self.conv1d(xbc, conv_state, valid)
        xbc = nn.silu(xbc)
        xs, Bm, Cm = mx.split(xbc, [D, D + G * N], axis=-1)
        dt = nn.softplus(dt.astype(mx.float32) + self.dt_bias)
        dt = mx.clip(dt, *self._dt_limit)
        A = -mx.exp(self.A_log.astype(mx.float32))
        y, ssm_state = ssd_scan(xs.reshape(Bsz, L, H, P), dt, A, Bm.reshape(Bsz, L, G, N),
                                Cm.reshape(Bsz, L, G, N), self.D, ssm_state, valid)
        y = y.reshape(Bsz, L, D)
        if "norm" in self:
            y = self.norm(y.astype(x.dtype), gate)
        else:
            y = (y * nn.silu(gate.astype(mx.float32))).astype(x.dtype)
        if state is not None:
            state[0], state[1] = conv_state, ssm_state
            state.advance(L)
        return self.out_proj(y)


class Model(mamba.Model):
    def __init__(self, args):
        super().__init__(args, Mamba2Mixer.from_args)
