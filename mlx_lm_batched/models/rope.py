"""Rotary position embeddings that take per-row offsets.

Every variant calls ``mx.fast.rope`` with an ``(B,)`` offset array, so each row of a
batch rotates by its own positions. Variants differ only in their frequencies.
"""

import math

import mlx.core as mx
import mlx.nn as nn


class RoPE(nn.Module):
    """Rotary embedding over the first ``dims`` features with fixed frequencies.

    ``freqs`` (when given) are the wavelengths ``mx.fast.rope`` expects, i.e. the
    inverse of the usual inverse frequencies.
    """

    def __init__(self, dims, base=10000.0, traditional=False, scale=1.0, freqs=None, mscale=1.0):
        super().__init__()
        self.dims = dims
        self.traditional = traditional
        self.scale = scale
        self.mscale = mscale
        self.base = None if freqs is not None else base
        self._freqs = freqs

    def __call__(self, x, offset):
        if self.mscale != 1.0:
            x = x * self.mscale
        return mx.fast.rope(
            x,
            self.dims,
            traditional=self.traditional,
            base=self.base,
            scale=self.scale,
            offset=offset,
            freqs=self._freqs,
        )


def _llama3_freqs(dims, base, cfg):
    factor = cfg["factor"]
    low = cfg.get("low_freq_factor", 1.0)
    high = cfg.get("high_freq_factor", 4.0)
    old_ctx = cfg.get("original_max_position_embeddings", 8192)
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    freqs = base ** (mx.arange(0, dims, 2) / dims)  # wavelength / (2 pi)
    wavelens = 2 * math.pi * freqs
    freqs = mx.where(wavelens > low_wavelen, freqs * factor, freqs)
    is_medium = (wavelens > high_wavelen) & (wavelens < low_wavelen)
    smooth = (old_ctx / wavelens - low) / (high - low)
    smoothed = freqs / ((1 - smooth) / factor + smooth)
    return mx.where(is_medium, smoothed, freqs)


def _yarn(dims, base, cfg, max_pos):
    factor = cfg["factor"]
    old_ctx = cfg.get("original_max_position_embeddings", max_pos)
    beta_fast = cfg.get("beta_fast", 32)
    beta_slow = cfg.get("beta_slow", 1)

    def correction_dim(rotations):
        return dims * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dims - 1)
    if low == high:
        high += 0.001
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    inv = (1 / pos_freqs) / factor * (1 - extrapolation) + (1 / pos_freqs) * extrapolation

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if "attention_factor" in cfg and cfg["attention_factor"] is not None:
        mscale = cfg["attention_factor"]
    elif cfg.get("mscale") and cfg.get("mscale_all_dim"):
        mscale = get_mscale(factor, cfg["mscale"]) / get_mscale(factor, cfg["mscale_all_dim"])
    else:
        mscale = get_mscale(factor)
    return 1 / inv, mscale


def make_rope(dims, base=10000.0, traditional=False, scaling=None, max_position_embeddings=None):
    """Build the rotary embedding a Hugging Face ``rope_scaling`` dict asks for.

    Supported ``rope_type``s: default, linear, llama3, yarn. Unknown types raise
    ``ValueError`` naming the type.
    """
    rope_type = "default"
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type == "default":
        return RoPE(dims, base, traditional)
    if rope_type == "linear":
        return RoPE(dims, base, traditional, scale=1.0 / scaling["factor"])
    if rope_type == "llama3":
        return RoPE(dims, traditional=traditional, freqs=_llama3_freqs(dims, base, scaling))
    if rope_type == "yarn":
        freqs, mscale = _yarn(dims, base, scaling, max_position_embeddings)
        return RoPE(dims, traditional=traditional, freqs=freqs, mscale=mscale)
    raise ValueError(f"unsupported rope_type '{rope_type}' (known: default, linear, llama3, yarn)")
