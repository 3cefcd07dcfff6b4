"""mlx-lm's RoPE classes (``mlx_lm.models.rope_utils``) with its constructors and call
signatures (``module(x, offset=0)``, ``offset`` an int or a ``(B,)`` array), built on
this package's RoPE (``rope.py``) and its frequency formulas.

They reproduce mlx-lm's results, which differ from ``initialize_rope``'s modules in
two places, both mlx-lm's choices for these classes: ``SuScaledRoPE`` always rotates
with the long factors (``rope.LongRoPE`` switches per row at the original context, as
transformers does), and ``YarnRoPE`` always scales by ``mscale / mscale_all_dim``'s
ratio (``initialize_rope`` follows transformers' ``attention_factor`` rules).
"""

import math

import mlx.core as mx

# The frequency formulas are rope.py's own (the private ones build its modules).
from .rope import (
    DynamicNTKRoPE,
    RoPE,
    _llama3_freqs,
    _yarn,
    make_rope,
    proportional_wavelengths,
    rope_wavelengths,
    yarn_mscale,
)


class _DefaultOffsetRoPE(RoPE):
    """``RoPE`` called as mlx-lm calls its modules: ``offset`` defaults to 0."""

    def __call__(self, x, offset=0):
        return super().__call__(x, offset)


class Llama3RoPE(_DefaultOffsetRoPE):
    """Llama 3.1's frequency smoothing from ``scaling_config`` (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``)."""

    def __init__(self, dims, max_position_embeddings=2048, traditional=False, base=10000,
                 scaling_config=None):
        super().__init__(dims, traditional=traditional,
                         freqs=_llama3_freqs(dims, base, scaling_config))
        self.max_position_embeddings = max_position_embeddings


class SuScaledRoPE(_DefaultOffsetRoPE):
    """Phi-3's LongRoPE as mlx-lm builds it: the long factors at every position, the
    rotated features scaled by ``long_mscale`` or ``sqrt(1 + ln(f) / ln(original))``
    with ``f = max_position_embeddings / original_max_position_embeddings``."""

    def __init__(self, dims, base=10000.0, max_position_embeddings=131072,
                 original_max_position_embeddings=4096, short_factor=1.0, long_factor=1.0,
                 short_mscale=None, long_mscale=None):
        factor = max_position_embeddings / original_max_position_embeddings
        default = 1.0 if factor <= 1.0 else math.sqrt(
            1 + math.log(factor) / math.log(original_max_position_embeddings))
        freqs = mx.array(long_factor, dtype=mx.float32) * rope_wavelengths(dims, base)
        super().__init__(dims, freqs=freqs, mscale=long_mscale or default)
        self.original_max_position_embeddings = original_max_position_embeddings
        self.dim = dims


class YarnRoPE(_DefaultOffsetRoPE):
    """YaRN: interpolated frequencies between ``beta_fast`` and ``beta_slow`` rotations,
    the rotated features scaled by ``mscale(factor, mscale) / mscale(factor,
    mscale_all_dim)``. ``inverse=True`` undoes the rotation and the scale."""

    def __init__(self, dims, traditional=False, max_position_embeddings=2048, base=10000,
                 scaling_factor=1.0, original_max_position_embeddings=4096, beta_fast=32,
                 beta_slow=1, mscale=1, mscale_all_dim=0):
        cfg = {"factor": scaling_factor, "beta_fast": beta_fast, "beta_slow": beta_slow,
               "original_max_position_embeddings": original_max_position_embeddings}
        freqs, _ = _yarn(dims, base, cfg, max_position_embeddings)
        ratio = yarn_mscale(scaling_factor, mscale) / yarn_mscale(scaling_factor, mscale_all_dim)
        super().__init__(dims, traditional=traditional, freqs=freqs, mscale=ratio)

    def __call__(self, x, offset=0, scale=1.0, inverse=False):
        if self.mscale != 1.0:
            factor = 1.0 / self.mscale if inverse else self.mscale
            x = mx.concatenate([x[..., : self.dims] * factor, x[..., self.dims:]], axis=-1)
        freqs = -self._freqs if inverse else self._freqs
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=scale,
                            offset=offset, freqs=freqs)


class ProportionalRoPE(_DefaultOffsetRoPE):
    """Gemma 4's proportional RoPE: the first ``rotated_dims / 2`` frequencies of a
    ``dims``-wide rotation (times ``factor``), the rest unrotated."""

    def __init__(self, dims, rotated_dims, traditional=False, base=10000.0, factor=1.0):
        if rotated_dims > dims:
            raise ValueError("rotated_dims should be smaller than dims")
        # mlx-lm rotates the frequencies of arange(0, rotated_dims, 2): ceil(rotated_dims / 2).
        freqs = proportional_wavelengths(dims, (rotated_dims + 1) // 2, base, factor)
        super().__init__(dims, traditional=traditional, freqs=freqs)


class DynamicNTKScalingRoPE(DynamicNTKRoPE):
    """Dynamic NTK scaling with mlx-lm's argument order; the base grows once a row's
    length passes ``max_position_embeddings`` (per row for a ``(B,)`` offset)."""

    def __init__(self, dims, max_position_embeddings, traditional, base, factor):
        super().__init__(dims, base, traditional, factor, max_position_embeddings)
        self.max_position_embeddings = max_position_embeddings

    def __call__(self, x, offset=0):
        if not isinstance(offset, mx.array) or offset.ndim == 0:
            offset = mx.full((x.shape[0],), offset, mx.int32)
        return super().__call__(x, offset)


def apply_yarn_mscale(scale, scaling_config):
    """``scale`` times ``mscale(factor, mscale_all_dim) ** 2`` for a YaRN config whose
    ``factor > 1`` and ``mscale_all_dim`` is set (the attention-scale half of the YaRN
    scale; the RoPE modules apply the ratio), else ``scale`` unchanged."""
    if not scaling_config:
        return scale
    rope_type = scaling_config.get("type") or scaling_config.get("rope_type", "default")
    m_all = scaling_config.get("mscale_all_dim", 0)
    factor = scaling_config.get("factor", 1)
    if rope_type == "default" or not m_all or factor <= 1:
        return scale
    return scale * yarn_mscale(factor, m_all) ** 2


def initialize_rope(dims, base=10000.0, traditional=False, scaling_config=None,
                    max_position_embeddings=None):
    """mlx-lm's ``rope_utils.initialize_rope``: :func:`make_rope`'s module under its
    keywords, as an instance of mlx-lm's class where that class computes the same
    rotation (``nn.RoPE`` for default and linear, ``Llama3RoPE``, ``ProportionalRoPE``
    with transformers' count of rotated frequencies); yarn and longrope keep
    ``make_rope``'s modules, which follow transformers where mlx-lm's classes do not."""
    rope_type = "default"
    if scaling_config:
        rope_type = scaling_config.get("rope_type", scaling_config.get("type")) or "default"
    if rope_type == "llama3":
        return Llama3RoPE(dims, max_position_embeddings or 2048, traditional, base,
                          scaling_config)
    if rope_type == "proportional":
        # make_rope's count of rotated frequencies (transformers'), as rotated features.
        angles = int(scaling_config.get("partial_rotary_factor", 1.0) * dims // 2)
        return ProportionalRoPE(dims, 2 * angles, traditional, base,
                                scaling_config.get("factor", 1.0))
    return make_rope(dims, base, traditional, scaling_config, max_position_embeddings)
