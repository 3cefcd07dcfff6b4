"""LoRA and DoRA adapters on linear layers, chosen per row of the batch.

An :class:`AdapterLinear` wraps one base linear layer (float or quantized) and holds
*slots*: slot 0 is the base layer alone, slot ``k`` adds adapter ``k``. Each row of a
forward call picks its slot, so rows with different adapters (and none) run in one
batch, each computing exactly what its adapter's model alone computes:

    out_b = g_k * (x_b W^T + s_k (x_b A_k) B_k) + bias,   k = slot of row b

``A_k`` ``(in, r)``, ``B_k`` ``(r, out)``, ``s_k`` the adapter's scale (mlx-lm's
``lora_a``, ``lora_b``, ``scale``); ``g_k`` is DoRA's per-output magnitude ``m / ||W +
s B^T A^T||`` (ones for LoRA and the base). Slots of lower rank are padded with zero
columns, which add exact zeros.

Which slot each row uses is per-row data of one forward call, like ``offset``: the
batch driver passes it to :func:`adapter_rows` around the model call (architecture files
call their projections as ``proj(x)``, so the rows' slots reach the linear layers
through this call-scoped context rather than through every architecture's signature).
Nothing is stored on the modules between calls. Outside any :func:`adapter_rows`
block every row uses the layer's ``default_slot`` (the adapter of a model loaded with
``load(..., adapter_path=...)``).
"""

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

_ROW_SLOTS = contextvars.ContextVar("mlx_lm_batched_adapter_rows", default=None)


@contextlib.contextmanager
def adapter_rows(slots):
    """Run the model calls inside the block with row ``b`` on adapter slot ``slots[b]``
    (an ``(B,)`` int array or list; -1 or None: the layers' default slot)."""
    if slots is not None and not isinstance(slots, mx.array):
        slots = mx.array(list(slots), dtype=mx.int32)
    token = _ROW_SLOTS.set(slots)
    try:
        yield
    finally:
        _ROW_SLOTS.reset(token)


@dataclass(frozen=True)
class AdapterWeights:
    """One adapter's weights for one linear layer: ``a`` ``(in, r)``, ``b`` ``(r, out)``,
    ``scale``, and DoRA's magnitude ``m`` ``(out,)`` (None for LoRA)."""

    a: mx.array
    b: mx.array
    scale: float
    m: Optional[mx.array] = None


def base_weight(linear):
    """The float weight ``(out, in)`` of a linear layer (dequantized when quantized)."""
    if isinstance(linear, nn.QuantizedLinear):
        return mx.dequantize(linear.weight, linear.scales, linear.get("biases"),
                             group_size=linear.group_size, bits=linear.bits, mode=linear.mode)
    return linear.weight


def input_dims(linear):
    """Input width of a float or quantized linear layer."""
    if isinstance(linear, nn.QuantizedLinear):
        return linear.weight.shape[1] * 32 // linear.bits
    return linear.weight.shape[1]


def _matmul_without_bias(linear, x):
    if isinstance(linear, nn.QuantizedLinear):
        return mx.quantized_matmul(x, linear.weight, linear.scales, linear.get("biases"),
                                   transpose=True, group_size=linear.group_size,
                                   bits=linear.bits, mode=linear.mode)
    return x @ linear.weight.T


def dora_magnitude_factor(linear, w: AdapterWeights):
    """DoRA's ``m / ||W + s B^T A^T||`` per output row (float32)."""
    weight = base_weight(linear).astype(mx.float32)
    adapted = weight + (w.scale * w.b.T.astype(mx.float32)) @ w.a.T.astype(mx.float32)
    return w.m.astype(mx.float32) / mx.linalg.norm(adapted, axis=1)


def fused_weight(linear, w: AdapterWeights):
    """The float weight ``(out, in)`` of ``linear`` with adapter ``w`` folded in (mlx-lm's
    ``fuse``: ``W + s B^T A^T``, for DoRA rescaled to the magnitude ``m``)."""
    weight = base_weight(linear)
    fused = weight + ((w.scale * w.b.T) @ w.a.T).astype(weight.dtype)
    if w.m is not None:
        fused = (w.m / mx.linalg.norm(fused, axis=1))[:, None] * fused
    return fused.astype(weight.dtype)


class _Held:
    """Holds Python objects on a module without making them parameters."""

    def __init__(self, items):
        self.items = items


class AdapterLinear(nn.Module):
    """A linear layer with adapter slots (see the module docstring).

    ``base``: the ``nn.Linear`` or ``nn.QuantizedLinear`` adapted; ``adapters``: one
    :class:`AdapterWeights` (or None: the adapter leaves this layer alone) per adapter,
    slots ``1..n``; ``default_slot``: the slot of rows outside :func:`adapter_rows`.
    """

    def __init__(self, base, adapters, default_slot=0):
        super().__init__()
        if not isinstance(base, (nn.Linear, nn.QuantizedLinear)):
            raise TypeError(f"adapters apply to Linear and QuantizedLinear layers, "
                            f"not {type(base).__name__}")
        self.linear = base
        adapters = list(adapters)
        # A plain holder, not a Module attribute list: the weights as loaded, for fuse.
        self.adapter_weights = _Held(adapters)
        self.default_slot = int(default_slot)
        n_out, n_in = base.weight.shape[0], input_dims(base)
        rank = max([w.a.shape[1] for w in adapters if w is not None] or [1])
        # The adapters' own dtype (mlx-lm multiplies with the arrays as trained).
        given = [w for w in adapters if w is not None]
        dtype = given[0].a.dtype if given else mx.float32
        a = [mx.zeros((n_in, rank), dtype)]
        b = [mx.zeros((rank, n_out), dtype)]
        scales, gains = [0.0], [mx.ones((n_out,), mx.float32)]
        for w in adapters:
            if w is None:
                w = AdapterWeights(mx.zeros((n_in, 1), dtype), mx.zeros((1, n_out), dtype), 0.0)
            if w.a.shape[0] != n_in or w.b.shape != (w.a.shape[1], n_out):
                raise ValueError(f"adapter shapes a{tuple(w.a.shape)} b{tuple(w.b.shape)} do "
                                 f"not fit a linear layer of {n_in} -> {n_out}")
            pad = rank - w.a.shape[1]
            a.append(mx.pad(w.a, [(0, 0), (0, pad)]).astype(dtype))
            b.append(mx.pad(w.b, [(0, pad), (0, 0)]).astype(dtype))
            scales.append(float(w.scale))
            gains.append(mx.ones((n_out,), mx.float32) if w.m is None
                         else dora_magnitude_factor(base, w))
        self.lora_a = mx.stack(a)  # (slots, in, r)
        self.lora_b = mx.stack(b)  # (slots, r, out)
        self.lora_scales = mx.array(scales, dtype=mx.float32)
        self.gains = mx.stack(gains)  # (slots, out), float32
        self._dora = any(w is not None and w.m is not None for w in adapters)

    def __call__(self, x):
        slots = _ROW_SLOTS.get()
        if slots is None:  # every row on one slot: plain matrix products
            k = self.default_slot
            if k == 0:
                return self.linear(x)
            z = (x @ self.lora_a[k]) @ self.lora_b[k]
            delta = (self.lora_scales[k] * z).astype(x.dtype)
            gain = self.gains[k].astype(x.dtype) if self._dora else None
        else:
            if x.ndim != 3 or x.shape[0] != slots.shape[0]:
                raise ValueError(f"per-row adapters need (rows, length, features) inputs "
                                 f"with {slots.shape[0]} rows, got shape {tuple(x.shape)}")
            slots = mx.where(slots < 0, self.default_slot, slots)
            z = (x @ self.lora_a[slots]) @ self.lora_b[slots]  # (B, L, out)
            delta = (self.lora_scales[slots][:, None, None] * z).astype(x.dtype)
            gain = self.gains[slots][:, None, :].astype(x.dtype) if self._dora else None
        if gain is None:
            return self.linear(x) + delta
        out = gain * (_matmul_without_bias(self.linear, x) + delta)
        return out + self.linear.bias if "bias" in self.linear else out


def adapter_slot_count(model):
    """Slots of the model's adapter layers: 1 (the base) + the adapters attached."""
    return 1 + max((len(m.adapter_weights.items) for _, m in model.named_modules()
                    if isinstance(m, AdapterLinear)), default=0)
