"""BitNet b1.58's ternary linear layer: weights in {-1, 0, 1} packed four to a byte
plus one scale, as BitNet checkpoints (``quantization_config.quant_method ==
"bitnet"``) and mlx-lm store them.

Layout: ``weight`` is ``uint8`` ``(ceil(out / 4), in)``; bits ``2i..2i+1`` of packed
row ``r`` hold output row ``i * out / 4 + r`` as ``value + 1``. ``weight_scale``
divides the product (``bitlinear``) or multiplies it (``autobitlinear``, whose
scale is stored inverted).

The CPU has no ternary kernel: the weight is unpacked to the input's dtype on each
call and multiplied as a dense matrix (exact: every ternary value is representable),
so a row's output never depends on the batch."""

import mlx.core as mx
import mlx.nn as nn


def pack_ternary(w):
    """Pack a ternary ``(out, in)`` matrix (``out`` divisible by 4) into the
    ``uint8`` ``(out / 4, in)`` layout above."""
    out = w.shape[0]
    if out % 4:
        raise ValueError(f"pack_ternary: {out} output rows are not a multiple of 4")
    codes = (w.astype(mx.int32) + 1).astype(mx.uint8).reshape(4, out // 4, -1)
    packed = codes[0]
    for i in range(1, 4):
        packed = packed | (codes[i] << (2 * i))
    return packed


def unpack_ternary(packed, out_features, dtype=mx.float32):
    """The ``(out_features, in)`` ternary matrix of a packed weight, in ``dtype``."""
    parts = [((packed >> (2 * i)) & 3).astype(dtype) - 1 for i in range(4)]
    return mx.concatenate(parts, axis=0)[:out_features]


class BitLinear(nn.Module):
    """``y = (x @ W.T) / weight_scale + bias`` with ternary packed ``W`` (``* scale``
    when ``invert_weight_scales`` is False: ``autobitlinear`` checkpoints)."""

    def __init__(self, in_features, out_features, bias=False, invert_weight_scales=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = mx.zeros(((out_features + 3) // 4, in_features), dtype=mx.uint8)
        self.weight_scale = mx.array([1.0])
        if bias:
            self.bias = mx.zeros((out_features,))
        self.invert_weight_scales = invert_weight_scales

    def __call__(self, x):
        w = unpack_ternary(self.weight, self.out_features, x.dtype)
        scale = self.weight_scale.astype(x.dtype)
        y = x @ w.T
        y = y / scale if self.invert_weight_scales else y * scale
        return y + self.bias if "bias" in self else y


def to_bitlinear(module, quantization_config):
    """Replace, in place, every ``nn.Linear`` of ``module`` except those named in
    ``quantization_config["modules_to_not_convert"]`` (paths relative to
    ``module``) by a :class:`BitLinear` of the same shape."""
    from mlx.utils import tree_flatten, tree_unflatten

    keep = set(quantization_config.get("modules_to_not_convert") or [])
    invert = quantization_config.get("linear_class", "") != "autobitlinear"
    swaps = []
    for name, m in tree_flatten(module.leaf_modules(), is_leaf=nn.Module.is_module):
        if isinstance(m, nn.Linear) and name not in keep:
            out_features, in_features = m.weight.shape
            swaps.append((name, BitLinear(in_features, out_features, "bias" in m, invert)))
    if swaps:
        module.update_modules(tree_unflatten(swaps))
    return module
