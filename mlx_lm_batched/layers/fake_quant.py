"""Round-trips through FP8 (e4m3) and FP4 (e2m1) with block scales: DeepSeek V4.1
stores its window keys in FP8 and its compressed keys in FP4, and its logits depend
on that rounding, so the layers reproduce it exactly (per row, per block: a row's
result never depends on the batch)."""

import mlx.core as mx

_FP4_VALUES = mx.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=mx.float32)


def _blocks(x, block):
    return x.astype(mx.float32).reshape(*x.shape[:-1], -1, block)


def fp8_round_trip(x, block=32):
    """``x`` rounded to FP8 e4m3 with one power-of-two scale per ``block`` features
    (unchanged when the last axis is not a multiple of ``block``)."""
    if x.shape[-1] % block:
        return x
    b = _blocks(x, block)
    amax = mx.maximum(mx.max(mx.abs(b), axis=-1, keepdims=True), 1e-4)
    scale = mx.power(2.0, mx.ceil(mx.log2(amax / 448.0)))
    q = mx.from_fp8(mx.to_fp8(mx.clip(b / scale, -448.0, 448.0)), mx.float32) * scale
    return q.reshape(x.shape).astype(x.dtype)


def _nearest_fp4(x):
    """Round to the nearest e2m1 value, ties as the reference breaks them."""
    mag = mx.abs(x)
    idx = mx.zeros(mag.shape, dtype=mx.int32)
    for t in (0.25, 1.25, 2.5, 5.0):  # ties round down
        idx = idx + (mag > t).astype(mx.int32)
    for t in (0.75, 1.75, 3.5):  # ties round up
        idx = idx + (mag >= t).astype(mx.int32)
    return mx.sign(x) * _FP4_VALUES[idx]


def fp4_round_trip(x, block, e4m3_scale=False):
    """``x`` rounded to FP4 e2m1 per ``block`` features; the block scale is a power of
    two, or itself FP8 e4m3 with ``e4m3_scale``."""
    if x.shape[-1] % block:
        return x
    b = _blocks(x, block)
    floor = 6.0 * 2.0 ** (-9 if e4m3_scale else -126)
    amax = mx.maximum(mx.max(mx.abs(b), axis=-1, keepdims=True), floor)
    if e4m3_scale:
        scale = mx.from_fp8(mx.to_fp8(amax / 6.0), mx.float32)
    else:
        scale = mx.power(2.0, mx.ceil(mx.log2(amax / 6.0)))
    q = _nearest_fp4(mx.clip(b / scale, -6.0, 6.0)) * scale
    return q.reshape(x.shape).astype(x.dtype)
