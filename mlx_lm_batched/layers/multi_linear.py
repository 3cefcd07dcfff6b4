"""mlx-lm's per-head linear maps (``models.mla.MultiLinear``): one ``(out, in)`` matrix
per head, applied to ``x`` ``(..., H, L, in)`` (or with ``transpose=False``, the matrix
itself: ``x @ W``), and its quantized form. mlx-lm's DeepSeek layers hold ``kv_b_proj``
split this way (``embed_q``/``unembed_out``); this package's MLA keeps ``kv_b_proj``
whole (``mla.merge_absorbed_kv_b`` rebuilds it), so these serve code that builds them."""

import math

import mlx.core as mx
import mlx.nn as nn


def _uniform_weight(input_dims, output_dims, num_heads):
    scale = math.sqrt(1.0 / input_dims)
    return mx.random.uniform(low=-scale, high=scale, shape=(num_heads, output_dims, input_dims))


class MultiLinear(nn.Module):
    """``weight`` ``(num_heads, output_dims, input_dims)``; ``module(x)`` is ``x @ W^T``
    per head, ``module(x, transpose=False)`` is ``x @ W``."""

    def __init__(self, input_dims, output_dims, num_heads):
        super().__init__()
        self.weight = _uniform_weight(input_dims, output_dims, num_heads)

    def __call__(self, x, transpose=True):
        return x @ (self.weight.swapaxes(-1, -2) if transpose else self.weight)

    def to_quantized(self, group_size, bits, mode="affine"):
        """The layer as a :class:`QuantizedMultiLinear` holding this weight quantized."""
        num_heads, output_dims, input_dims = self.weight.shape
        q = QuantizedMultiLinear(input_dims, output_dims, num_heads, group_size, bits, mode)
        q.weight, q.scales, *biases = mx.quantize(self.weight, group_size, bits, mode=mode)
        q.biases = biases[0] if biases else None
        return q


class QuantizedMultiLinear(nn.Module):
    """:class:`MultiLinear` with a quantized weight (``weight``, ``scales``, ``biases``);
    frozen, as MLX's quantized layers are."""

    def __init__(self, input_dims, output_dims, num_heads, group_size, bits, mode):
        super().__init__()
        self.group_size, self.bits, self.mode = group_size, bits, mode
        weight = _uniform_weight(input_dims, output_dims, num_heads)
        self.weight, self.scales, *biases = mx.quantize(weight, group_size, bits, mode=mode)
        self.biases = biases[0] if biases else None
        self.freeze()

    def __call__(self, x, transpose=True):
        return mx.quantized_matmul(x, self["weight"], scales=self["scales"],
                                   biases=self.get("biases"), transpose=transpose,
                                   group_size=self.group_size, bits=self.bits, mode=self.mode)
