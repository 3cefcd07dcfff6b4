"""Mamba (and Falcon-Mamba, which adds weightless RMS norms on dt, B and C): a stack
of selective-state-space mixers, one ``StateCache`` (conv inputs, SSM state) per layer."""

import math
from dataclasses import dataclass
from typing import Optional, Union

import mlx.core as mx
import mlx.nn as nn

from ..cache.state import StateCache
from ..layers.norms import RMSNorm
from ..layers.part_checks import require_positive_integers
from ..layers.ssm import (
    CausalConv1d,
    base_cache,
    column_validity,
    selective_scan,
    weightless_rms_norm,
)
from ..layers.step import resolve_offset
from .common import StackArgs


@dataclass
class ModelArgs(StackArgs):
    """Mamba's config (Hugging Face ``MambaConfig`` names and defaults); no attention
    heads, so the shared stack fields only (``StackArgs``), not ``DecoderArgs``."""

    vocab_size: int
    state_size: int = 16
    expand: int = 2
    conv_kernel: int = 4
    intermediate_size: Optional[int] = None
    time_step_rank: Union[int, str] = "auto"
    use_bias: bool = False
    use_conv_bias: bool = True
    layer_norm_epsilon: float = 1e-5
    mixer_rms_eps: float = 1e-6
    tie_word_embeddings: bool = True
    # mlx-lm's name: weightless RMS norms on dt, B and C (Falcon Mamba's); None: by
    # model_type, as mlx-lm and transformers decide it.
    use_bcdt_rms: Optional[bool] = None

    def __post_init__(self):
        if self.use_bcdt_rms is None:
            self.use_bcdt_rms = self.model_type == "falcon_mamba"
        # Hugging Face derives both when absent (MambaConfig and Mamba2Config alike).
        if self.intermediate_size is None:
            self.intermediate_size = self.expand * self.hidden_size
        if self.time_step_rank == "auto":
            self.time_step_rank = math.ceil(self.hidden_size / 16)


@dataclass(frozen=True)
class SSMDims:
    """The widths of Mamba's selective SSM: ``inner`` channels, ``state_size`` states
    per channel, ``dt_rank`` (the low-rank time step's) and the convolution's
    ``kernel``."""

    inner: int
    state_size: int
    dt_rank: int
    kernel: int

    def __post_init__(self):
        require_positive_integers(self)


class MambaMixer(nn.Module):
    """Mamba's selective-SSM mixer. ``bcdt_norm``: RMS norms on dt, B and C before
    the scan: None, ``"weightless"`` (Falcon-Mamba) or ``"weighted"`` (Jamba's
    ``dt_layernorm``/``b_layernorm``/``c_layernorm``)."""

    def __init__(self, hidden_size, dims, bias=False, conv_bias=True, bcdt_norm=None, eps=1e-6):
        """``dims``: the :class:`SSMDims`; ``bias``: of ``in_proj`` and ``out_proj``;
        ``conv_bias``: of the convolution; ``eps``: of the dt/B/C norms."""
        super().__init__()
        if not isinstance(dims, SSMDims):
            raise ValueError(f"MambaMixer dims must be an SSMDims, got {dims!r}")
        D, N, R, kernel = dims.inner, dims.state_size, dims.dt_rank, dims.kernel
        self.sizes = (D, N, R)
        self.in_proj = nn.Linear(hidden_size, 2 * D, bias=bias)
        self.conv1d = CausalConv1d(D, kernel, bias=conv_bias)
        self.x_proj = nn.Linear(D, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, D, bias=True)
        self.A_log = mx.zeros((D, N))
        self.D = mx.ones((D,))
        self.out_proj = nn.Linear(D, hidden_size, bias=bias)
        self.bcdt_norm, self.bcdt_eps = bcdt_norm, eps
        if bcdt_norm == "weighted":
            self.dt_layernorm = RMSNorm(R, eps)
            self.b_layernorm = RMSNorm(N, eps)
            self.c_layernorm = RMSNorm(N, eps)

    @classmethod
    def from_args(cls, args):
        dims = SSMDims(args.intermediate_size, args.state_size, args.time_step_rank,
                       args.conv_kernel)
        return cls(args.hidden_size, dims, args.use_bias, args.use_conv_bias,
                   "weightless" if args.use_bcdt_rms else None, args.mixer_rms_eps)

    def _norm_bcdt(self, dt, Bm, Cm):
        if self.bcdt_norm == "weightless":
            return tuple(weightless_rms_norm(t, self.bcdt_eps) for t in (dt, Bm, Cm))
        if self.bcdt_norm == "weighted":
            return self.dt_layernorm(dt), self.b_layernorm(Bm), self.c_layernorm(Cm)
        return dt, Bm, Cm

    def ssm_step(self, x, A, state=None):
        """One step of the selective scan for ``x`` ``(B, D)`` (the convolved, activated
        input of one position): ``(y (B, D), state (B, D, N))``, where ``A`` is
        ``-exp(A_log)`` and ``state`` the previous one (None: zeros). The gate and the
        output projection are not applied (mlx-lm's ``MambaBlock.ssm_step``)."""
        D, N, R = self.sizes
        dt, Bm, Cm = self._norm_bcdt(*mx.split(self.x_proj(x), [R, R + N], axis=-1))
        dt = nn.softplus(self.dt_proj(dt))
        every = mx.array([[True]])  # one real column per row
        y, state = selective_scan(x[:, None], dt[:, None], A, Bm[:, None], Cm[:, None],
                                  self.D, state, every)
        return y[:, 0].astype(x.dtype), state

    def __call__(self, x, mask, offset, cache=None, attention=None):
        """``mask``/``attention`` are unused (the mixers share attention's signature)."""
        D, N, R = self.sizes
        valid = column_validity(cache, offset, x.shape[1])
        state = base_cache(cache)
        conv_state, ssm_state = (None, None) if state is None else (state[0], state[1])
        x, z = mx.split(self.in_proj(x), 2, axis=-1)
        x, conv_state = self.conv1d(x, conv_state, valid)
        x = nn.silu(x)
        dt, Bm, Cm = mx.split(self.x_proj(x), [R, R + N], axis=-1)
        dt, Bm, Cm = self._norm_bcdt(dt, Bm, Cm)
        dt = nn.softplus(self.dt_proj(dt))
        A = -mx.exp(self.A_log.astype(mx.float32))
        y, ssm_state = selective_scan(x, dt, A, Bm, Cm, self.D, ssm_state, valid)
        y = (y * nn.silu(z.astype(mx.float32))).astype(x.dtype)
        if state is not None:
            state[0], state[1] = conv_state, ssm_state
            state.advance(x.shape[1])
        return self.out_proj(y)


class MambaBlock(nn.Module):
    """A pre-norm residual block around one mixer."""

    def __init__(self, args, mixer=MambaMixer.from_args):
        super().__init__()
        self.norm = RMSNorm(args.hidden_size, eps=args.layer_norm_epsilon)
        self.mixer = mixer(args)

    def __call__(self, x, offset, cache=None):
        return x + self.mixer(self.norm(x), None, offset, cache)

    def ssm_step(self, x, A, state=None):
        """The mixer's one-step scan (mlx-lm's ``MambaBlock`` is the mixer itself)."""
        return self.mixer.ssm_step(x, A, state)


class Backbone(nn.Module):
    def __init__(self, args, mixer):
        super().__init__()
        self.embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [MambaBlock(args, mixer) for _ in range(args.num_hidden_layers)]
        self.norm_f = RMSNorm(args.hidden_size, eps=args.layer_norm_epsilon)


class Model(nn.Module):
    """A stack of pre-norm mixer blocks (``mixer(args)``: builds one layer's mixer,
    Mamba's by default; Mamba-2 passes its own)."""

    def __init__(self, args, mixer=MambaMixer.from_args):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.backbone = Backbone(args, mixer)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 **unused):
        """Logits ``(B, L, vocab)``; ``offset`` as for every model (padding columns
        have negative positions); ``mask`` is not needed by a recurrent stack."""
        offset = resolve_offset(inputs, offset, cache)
        h = self.backbone.embeddings(inputs) if input_embeddings is None else input_embeddings
        cache = cache if cache is not None else [None] * len(self.layers)
        for layer, c in zip(self.layers, cache):
            h = layer(h, offset, c)
        h = self.backbone.norm_f(h)
        if "lm_head" in self:
            return self.lm_head(h)
        return self.backbone.embeddings.as_linear(h)

    @property
    def layers(self):
        return self.backbone.layers

    def make_cache(self, max_kv_size=None):
        """One state cache per layer (``max_kv_size`` does not apply: the state is fixed)."""
        return [StateCache(2) for _ in self.layers]

    def sanitize(self, weights):
        k = self.args.conv_kernel
        out = {}
        for name, w in weights.items():
            if name.endswith("conv1d.weight"):
                w = CausalConv1d.sanitize_weight(w, k)
            out[name] = w
        if self.args.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        return out
