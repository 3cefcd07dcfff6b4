"""mlx-lm's activation functions and modules (``mlx_lm.models.activations``,
``switch_layers.SwiGLU``) with its signatures.

Plain functions, not ``mx.compile`` objects (a module holding one could not be
copied or pickled); the formulas are the published ones: SwiGLU, GPT-OSS's clamped
SwiGLU (``(clip(x) + 1) * g * sigmoid(alpha * g)`` with ``g = min(gate, limit)``) and
xIELU (arXiv 2411.13010)."""

import math

import mlx.core as mx
import mlx.nn as nn

from ..layers.mlp import swiglu


def precise_swiglu(h, gate, x):
    """``silu(gate) * x`` computed in float32 and returned in ``h``'s dtype."""
    return (swiglu(gate.astype(mx.float32), x.astype(mx.float32))).astype(h.dtype)


def swiglu_oai(gate, x, alpha=1.702, limit=7.0):
    """GPT-OSS's SwiGLU: the gate clipped from above, ``x`` to ``[-limit, limit]``, and
    1 added to the linear part."""
    gate = mx.minimum(gate, limit)
    x = mx.clip(x, -limit, limit)
    return (x + 1.0) * (gate * mx.sigmoid(alpha * gate))


def xielu(x, alpha_p, alpha_n, beta, eps):
    """xIELU with raw parameters: ``softplus(alpha_p) x^2 + beta x`` for ``x > 0``, else
    ``(expm1(min(x, eps)) - x) (beta + softplus(alpha_n)) + beta x``."""
    alpha_p = nn.softplus(alpha_p)
    alpha_n = beta + nn.softplus(alpha_n)
    negative = (mx.expm1(mx.minimum(x, eps)) - x) * alpha_n
    return mx.where(x > 0, alpha_p * mx.square(x), negative) + beta * x


class SwiGLU(nn.Module):
    """``SwiGLU()(x, gate) = silu(gate) * x`` (mlx-lm's two-argument module)."""

    def __call__(self, x, gate):
        return swiglu(gate, x)


class SwigluOAI(nn.Module):
    """``SwigluOAI(alpha, limit)(x, gate)``: :func:`swiglu_oai` as a module."""

    def __init__(self, alpha=1.702, limit=7.0):
        super().__init__()
        self._alpha, self._limit = alpha, limit

    def __call__(self, x, gate):
        return swiglu_oai(gate, x, alpha=self._alpha, limit=self._limit)


def _inverse_softplus(y):
    return math.log(math.expm1(y))


class XieLU(nn.Module):
    """xIELU with learned ``alpha_p``/``alpha_n`` stored through softplus, initialised
    so that ``softplus(alpha_p) = alpha_p_init`` and ``beta + softplus(alpha_n) =
    alpha_n_init`` (mlx-lm's constructor and parameter names)."""

    def __init__(self, alpha_p_init=0.8, alpha_n_init=0.8, beta=0.5, eps=-1e-6):
        super().__init__()
        self.alpha_p = mx.array(_inverse_softplus(alpha_p_init), mx.float32)
        self.alpha_n = mx.array(_inverse_softplus(alpha_n_init - beta), mx.float32)
        self.beta = mx.array(beta, mx.float32)
        self.eps = mx.array(eps, mx.float32)

    def __call__(self, x):
        return xielu(x, self.alpha_p, self.alpha_n, self.beta, self.eps)
