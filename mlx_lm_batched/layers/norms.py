"""Normalisation layers with Hugging Face parameter names. RMS norms are one primitive
on the CPU for float32 (``_cpu_prims``), ``mx.fast.rms_norm`` elsewhere."""

import mlx.core as mx
import mlx.nn as nn

from .. import _cpu_prims


def unit_rms_norm(x, eps):
    """RMS norm without a weight (a module function: models holding it still copy)."""
    return _cpu_prims.rms_norm(x, None, eps)


class RMSNorm(nn.Module):
    """RMS norm; ``zero_centered`` stores ``w`` and scales by ``1 + w`` (Gemma);
    ``offset``: scales by ``w + offset`` (PLaMo 3's 1/5 and 1/5**1.5 on its output
    norms); ``affine=False`` has no weight (Llama 4's L2 QK-norm)."""

    def __init__(self, dims, eps=1e-6, zero_centered=False, affine=True, offset=None):
        super().__init__()
        if affine:
            centered = zero_centered or offset is not None
            self.weight = mx.zeros((dims,)) if centered else mx.ones((dims,))
        self.eps = eps
        self.zero_centered = zero_centered
        self.offset = offset

    def __call__(self, x):
        if "weight" not in self:
            return _cpu_prims.rms_norm(x, None, self.eps)
        w = 1.0 + self.weight if self.zero_centered else self.weight
        if self.offset is not None:
            w = w + self.offset
        return _cpu_prims.rms_norm(x, w, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with optional bias; ``zero_centered`` scales by ``1 + w`` (Nemotron's
    LayerNorm1P)."""

    def __init__(self, dims, eps=1e-5, bias=True, zero_centered=False):
        super().__init__()
        self.weight = mx.zeros((dims,)) if zero_centered else mx.ones((dims,))
        if bias:
            self.bias = mx.zeros((dims,))
        self.eps = eps
        self.zero_centered = zero_centered

    def __call__(self, x):
        w = 1.0 + self.weight if self.zero_centered else self.weight
        return mx.fast.layer_norm(x, w, self.get("bias"), self.eps)


class HeadwiseLayerNorm(nn.Module):
    """LayerNorm of each head of a ``(..., heads * head_dim)`` projection with its own
    ``(heads, head_dim)`` weight (Cohere, StableLM QK-norm; use ``QKNorm(full=True)``)."""

    def __init__(self, heads, head_dim, eps=1e-5, bias=False):
        super().__init__()
        self.weight = mx.ones((heads, head_dim))
        if bias:
            self.bias = mx.zeros((heads, head_dim))
        self.eps = eps

    def __call__(self, x):
        heads, head_dim = self.weight.shape
        h = mx.fast.layer_norm(x.reshape(*x.shape[:-1], heads, head_dim), None, None, self.eps)
        h = h * self.weight
        if "bias" in self:
            h = h + self.bias
        return h.reshape(x.shape)
