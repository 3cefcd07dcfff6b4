"""Hadamard-rotated 2-bit weights (PrismML's packs of Qwen3.5).

A packed linear layer's weight had a signed, normalised blockwise Walsh-Hadamard
rotation ``R = H_block · diag(signs)`` folded into its input axis before 2-bit affine
quantization (group size 128): ``W' = W R^T``. ``R`` is orthogonal, so rotating the
input the same way gives ``R x · W' = x · W``. A packed embedding stores its rows
rotated the same way; looking a row up rotates it back (``R^T``). The rotation runs in
float32 (the packs are calibrated against it). ``block`` 0: no rotation.
"""

import math

import mlx.core as mx
import mlx.nn as nn

GROUP_SIZE, BITS = 128, 2
BLOCKS = (0, 512, 1024, 2048, 4096, 8192)


def hadamard_rotate(x, block, signs, inverse=False):
    """``R x`` (or ``R^T x`` when ``inverse``) over the last axis of ``x``, blockwise."""
    shape, dtype = x.shape, x.dtype
    x = x.astype(mx.float32)
    if not inverse:
        x = x * signs
    x = mx.hadamard_transform(x.reshape(-1, block), scale=1 / math.sqrt(block)).reshape(shape)
    if inverse:
        x = x * signs
    return x.astype(dtype)


class HadamardQuantizedLinear(nn.Module):
    """A frozen 2-bit affine linear layer whose weight holds the input rotation."""

    def __init__(self, input_dims, output_dims, block):
        super().__init__()
        if input_dims % GROUP_SIZE:
            raise ValueError(f"packed input width {input_dims} is not a multiple of {GROUP_SIZE}")
        if block not in BLOCKS or (block and input_dims % block):
            raise ValueError(f"invalid Hadamard block {block} for width {input_dims}")
        self.block = block
        self.weight = mx.zeros((output_dims, input_dims * BITS // 32), dtype=mx.uint32)
        self.scales = mx.zeros((output_dims, input_dims // GROUP_SIZE), dtype=mx.float16)
        self.biases = mx.zeros_like(self.scales)
        if block:
            self.signs = mx.ones((input_dims,), dtype=mx.float32)
        self.freeze()

    def __call__(self, x):
        if self.block:
            x = hadamard_rotate(x, self.block, self.signs)
        return mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True,
                                   group_size=GROUP_SIZE, bits=BITS)


class HadamardQuantizedEmbedding(HadamardQuantizedLinear):
    """Packed embedding rows: dequantized (float16) and rotated back on lookup; as the
    tied head, the packed linear layer itself."""

    def __call__(self, indices):
        flat = indices.reshape(-1)
        rows = mx.dequantize(self.weight[flat], self.scales[flat], self.biases[flat],
                             group_size=GROUP_SIZE, bits=BITS)
        rows = rows.reshape(*indices.shape, -1).astype(mx.float16)
        return hadamard_rotate(rows, self.block, self.signs, inverse=True) if self.block else rows

    def as_linear(self, x):
        return super().__call__(x)
