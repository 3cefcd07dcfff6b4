"""Rotary position embeddings that take per-row offsets.

Fixed-frequency variants call ``mx.fast.rope`` with an ``(B,)`` offset array, so each
row of a batch rotates by its own positions; they differ only in their frequencies. On
the CPU (float32) they are one primitive of ``_cpu_prims`` instead of ``mx.fast.rope``'s
fallback of some 20 ops.
Length-dependent variants (``dynamic``, ``longrope``) choose frequencies per row
from that row's own sequence length, so a padded row matches the prompt run alone.
Like transformers, they depend on how a sequence is split into forward calls:
``BatchEngine`` feeds a prompt as ``prompt[:-1]`` then its last token, which equals
transformers fed the same way, but not its one-call ``generate`` prefill when the
prompt is longer than the scaling threshold.
"""

import math

import mlx.core as mx
import mlx.nn as nn

from .. import _cpu_prims


def rope_wavelengths(dims, base, count=None):
    """``base ** (2i / dims)`` for the first ``count`` (default: all) rotated pairs ``i``:
    each pair's wavelength over 2 pi, the inverse of the usual inverse frequencies and
    what ``mx.fast.rope``'s ``freqs`` takes. ``base`` may be an array (one per row)."""
    stop = dims if count is None else 2 * count
    return base ** (mx.arange(0, stop, 2, dtype=mx.float32) / dims)


class _Constant:
    """Holds an array as a plain attribute: ``nn.Module`` puts arrays in its tree."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class RoPE(nn.RoPE):
    """Rotary embedding over the first ``dims`` features with fixed frequencies.

    ``freqs`` (when given) are the wavelengths ``mx.fast.rope`` expects, i.e. the
    inverse of the usual inverse frequencies. A subclass of ``mlx.nn.RoPE`` (what
    mlx-lm's models hold, and what code written for them checks for); its own call
    takes per-row offsets.
    """

    def __init__(self, dims, base=10000.0, traditional=False, scale=1.0, freqs=None, mscale=1.0):
        super().__init__(dims, traditional=traditional, base=base, scale=scale)
        self.mscale = mscale
        self.base = None if freqs is not None else base
        self._freqs = freqs
        # The inverse frequencies by mx.fast.rope's own formulas, for the CPU primitive:
        # a constant kept off the module's tree (not a parameter: never saved, loaded,
        # cast or counted in bits per weight).
        self._inverse = _Constant(1.0 / freqs if freqs is not None
                                  else _cpu_prims.inverse_frequencies(dims, base))

    def __call__(self, x, offset):
        if self.mscale != 1.0:
            # The attention factor scales the rotated features only (partial rotary).
            if self.dims < x.shape[-1]:
                x = mx.concatenate([x[..., : self.dims] * self.mscale, x[..., self.dims :]], -1)
            else:
                x = x * self.mscale
        rotated = _cpu_prims.rope(x, self.dims, self.traditional, self._inverse.value, self.scale,
                                  offset)
        if rotated is not None:
            return rotated
        return mx.fast.rope(
            x,
            self.dims,
            traditional=self.traditional,
            base=self.base,
            scale=self.scale,
            offset=offset,
            freqs=self._freqs,
        )


def negated_rope(dims, base):
    """RoPE rotating by the negated angle (nanochat's and talkie's ``rotate_half`` with
    flipped signs): the wavelengths of ``base`` with their signs flipped."""
    return RoPE(dims, freqs=-rope_wavelengths(dims, base))


def _llama3_freqs(dims, base, cfg):
    factor = cfg["factor"]
    low = cfg.get("low_freq_factor", 1.0)
    high = cfg.get("high_freq_factor", 4.0)
    old_ctx = cfg.get("original_max_position_embeddings", 8192)
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    freqs = rope_wavelengths(dims, base)
    wavelens = 2 * math.pi * freqs
    freqs = mx.where(wavelens > low_wavelen, freqs * factor, freqs)
    is_medium = (wavelens > high_wavelen) & (wavelens < low_wavelen)
    smooth = (old_ctx / wavelens - low) / (high - low)
    smoothed = freqs / ((1 - smooth) / factor + smooth)
    return mx.where(is_medium, smoothed, freqs)


def _yarn(dims, base, cfg, max_pos):
    old_ctx = cfg.get("original_max_position_embeddings") or max_pos
    # DeepSeek-style configs may omit factor: the context extension ratio.
    factor = cfg.get("factor") or max_pos / old_ctx
    beta_fast = cfg.get("beta_fast") or 32
    beta_slow = cfg.get("beta_slow") or 1
    truncate = cfg.get("truncate", True)  # False: fractional correction range

    def correction_dim(rotations):
        return dims * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = rope_wavelengths(dims, base)
    inv = (1 / pos_freqs) / factor * (1 - extrapolation) + (1 / pos_freqs) * extrapolation

    if "attention_factor" in cfg and cfg["attention_factor"] is not None:
        mscale = cfg["attention_factor"]
    elif cfg.get("mscale") and cfg.get("mscale_all_dim"):
        mscale = yarn_mscale(factor, cfg["mscale"]) / yarn_mscale(factor, cfg["mscale_all_dim"])
    else:
        mscale = yarn_mscale(factor)
    return 1 / inv, mscale


def yarn_mscale(scale, m=1.0):
    """YaRN's magnitude correction ``0.1 m ln(scale) + 1`` (1 when not extending)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _row_lengths(offset, query_len):
    """Each row's sequence length as transformers counts it for one sequence: the last
    position in this call plus one (``max(position_ids) + 1``)."""
    return offset.astype(mx.int32) + query_len


class LongRoPE(nn.Module):
    """Phi-3 LongRoPE (``longrope``, legacy ``su``): per-frequency rescaling factors.

    transformers uses the short factors while a sequence fits the pretraining length
    (``original_max_position_embeddings``) and the long ones beyond it, deciding once
    per forward call from ``max(position_ids) + 1``: a prompt longer than that
    rotates all its tokens with the long factors; while decoding, each new token
    switches to them once its position reaches the limit (cached keys keep theirs).
    Here the same rule holds per row, using the row's own length. ``mscale`` (the
    attention factor) applies in both regimes, as in transformers.
    """

    def __init__(self, dims, base, traditional, short_factor, long_factor, original_max, mscale):
        super().__init__()
        wavelengths = rope_wavelengths(dims, base)
        short = mx.array(short_factor, dtype=mx.float32) * wavelengths
        long = mx.array(long_factor, dtype=mx.float32) * wavelengths
        self.short = RoPE(dims, traditional=traditional, freqs=short, mscale=mscale)
        self.long = RoPE(dims, traditional=traditional, freqs=long, mscale=mscale)
        self.original_max = original_max

    def __call__(self, x, offset):
        use_long = _row_lengths(offset, x.shape[2]) > self.original_max
        return mx.where(use_long[:, None, None, None], self.long(x, offset), self.short(x, offset))


class DynamicNTKRoPE(nn.Module):
    """Dynamic NTK scaling (``dynamic``): the base grows with the sequence length.

    For a sequence of length ``n > max_position_embeddings`` transformers rotates with
    ``base * (factor * n / max_pos - (factor - 1)) ** (dims / (dims - 2))`` and the
    plain base otherwise, where ``n = max(position_ids) + 1`` of the current forward
    call (the whole prompt in a prefill, the new token's position + 1 in a decode
    step; cached keys keep the rotation they were stored with). Batched, ``n`` is
    each row's own length (offset + query length), so every row gets its own base:
    a padded row matches that prompt run alone. As in transformers, results depend
    on how a sequence is split into forward calls (chunked prefill).
    ``mx.fast.rope`` takes one set of frequencies, so this rotates explicitly.
    """

    def __init__(self, dims, base, traditional, factor, max_position_embeddings):
        super().__init__()
        self.dims, self.base, self.traditional = dims, base, traditional
        self.factor = factor
        self.max_pos = max_position_embeddings

    def __call__(self, x, offset):
        L, d = x.shape[2], self.dims
        n = mx.maximum(_row_lengths(offset, L), self.max_pos).astype(mx.float32)
        base = self.base * (self.factor * n / self.max_pos - (self.factor - 1)) ** (d / (d - 2))
        inv_freq = 1.0 / rope_wavelengths(d, base[:, None])  # (B, d/2)
        positions = (offset[:, None] + mx.arange(L)).astype(mx.float32)  # (B, L)
        angles = positions[:, None, :, None] * inv_freq[:, None, None, :]  # (B, 1, L, d/2)
        cos, sin = mx.cos(angles), mx.sin(angles)
        rot = x[..., :d]
        if self.traditional:  # pairs of adjacent features
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = mx.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).reshape(rot.shape)
        else:  # first half with second half
            x1, x2 = rot[..., : d // 2], rot[..., d // 2 :]
            out = mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        out = out.astype(x.dtype)
        return out if d == x.shape[-1] else mx.concatenate([out, x[..., d:]], -1)


def _longrope(dims, base, traditional, cfg, max_pos):
    original = cfg.get("original_max_position_embeddings") or max_pos
    factor = cfg.get("factor") or max_pos / original
    mscale = cfg.get("attention_factor")
    if mscale is None:
        mscale = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return LongRoPE(dims, base, traditional, cfg["short_factor"], cfg["long_factor"],
                    original, mscale)


def proportional_wavelengths(dims, angles, base, factor=1.0):
    """Gemma 4's ``proportional`` RoPE: a rotation over the whole head (features ``i``
    and ``i + dims/2`` pair up) whose first ``angles`` frequencies are the usual ones
    for ``dims`` (wavelengths times ``factor``) and the rest zero (infinite wavelength:
    those features pass unrotated). Not the same as rotating the first ``2 * angles``
    features, which would pair other features."""
    rotated = factor * rope_wavelengths(dims, base, angles)
    return mx.concatenate([rotated, mx.full((dims // 2 - angles,), mx.inf, mx.float32)])


def _proportional_freqs(dims, base, cfg):
    """:func:`proportional_wavelengths` of a ``rope_scaling`` dict, counting the rotated
    frequencies as transformers does: ``int(partial_rotary_factor * dims // 2)``."""
    angles = int(cfg.get("partial_rotary_factor", 1.0) * dims // 2)
    return proportional_wavelengths(dims, angles, base, cfg.get("factor", 1.0))


def make_rope(dims, base=10000.0, traditional=False, scaling=None, max_position_embeddings=None):
    """Build the rotary embedding a Hugging Face ``rope_scaling`` dict asks for.

    Supported ``rope_type``s: default, linear, llama3, yarn, dynamic, longrope (and
    its legacy name su), proportional. Unknown types raise ``ValueError`` naming the type.
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
    if rope_type == "dynamic":
        return DynamicNTKRoPE(dims, base, traditional, scaling["factor"], max_position_embeddings)
    if rope_type in ("longrope", "su"):
        return _longrope(dims, base, traditional, scaling, max_position_embeddings)
    if rope_type == "proportional":
        return RoPE(dims, traditional=traditional, freqs=_proportional_freqs(dims, base, scaling))
    raise ValueError(f"unsupported rope_type '{rope_type}' "
                     "(known: default, linear, llama3, yarn, dynamic, longrope, su, proportional)")
