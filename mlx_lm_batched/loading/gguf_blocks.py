"""ggml's block quantizations that are exactly MLX affine groups of 32 weights.

Each of these encodes ``w = scale * q + bias`` per group of 32 consecutive weights of a row,
with ``q`` an unsigned integer of ``bits`` bits, which is MLX's affine format with
``group_size=32``:

- Q4_0, Q5_0, Q8_0: one f16 ``d`` per 32 weights and a signed ``q``; the sign becomes an
  offset folded into the bias (``d * (q - 8) = d * q - 8 d``; ``8 d`` is exact in f16).
- Q4_1, Q5_1: one f16 ``d`` and f16 ``m`` per 32 weights: ``d * q + m``.
- Q4_K, Q5_K: 256-weight super-blocks of eight groups; each group's 6-bit scale and min
  multiply the super-block's f16 ``d`` and ``dmin``. The products need up to 17 bits of
  mantissa, so their scales and biases are float32 (exact; f16 would round them).

In float32 ``scale * q + bias`` is bit for bit ggml's own ``d * q - m`` for all of them (the
product ``scale * q`` is exact), so dequantizing these triples gives llama.cpp's and
transformers' values. Q2_K, Q3_K and Q6_K use groups of 16 weights, which MLX does not
support: those are dequantized to float32 by the caller.
"""

import numpy as np

GROUP_SIZE = 32
SUPER_BLOCK = 256  # weights per K-quant block

# ggml type id -> (bits, bytes per block, weights per block)
AFFINE_TYPES = {
    2: (4, 18, 32),     # Q4_0: d, 16 bytes of nibbles
    3: (4, 20, 32),     # Q4_1: d, m, 16 bytes of nibbles
    6: (5, 22, 32),     # Q5_0: d, 4 bytes of fifth bits, 16 bytes of nibbles
    7: (5, 24, 32),     # Q5_1: d, m, fifth bits, nibbles
    8: (8, 34, 32),     # Q8_0: d, 32 int8
    12: (4, 144, 256),  # Q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
    13: (5, 176, 256),  # Q5_K: as Q4_K plus 32 bytes of fifth bits
}


def _f16(byte_columns):
    """float16 values of two-byte columns (..., 2) -> (..., 1)."""
    return np.ascontiguousarray(byte_columns).view(np.float16)


def _offset_bias(d, offset):
    """The f16 bias ``-offset * d`` of a signed type stored unsigned (exact: a power of two
    times an f16)."""
    return (d.astype(np.float32) * -offset).astype(np.float16)


def _nibbles(qs):
    """ggml's 4-bit layout for one group: element j in the low nibble of byte j, element
    j + 16 in its high nibble (``qs``: (..., 16) bytes -> (..., 32) values)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _fifth_bits(qh_bytes):
    """The 32 high bits of a Q5_0/Q5_1 group, bit j of a little-endian uint32 for
    element j: (..., 4) bytes -> (..., 32) values of 0 or 16."""
    bits = np.unpackbits(np.ascontiguousarray(qh_bytes), axis=-1, bitorder="little")
    return bits << 4


def _k_scales_mins(packed):
    """The eight 6-bit scales and mins of K-quant super-blocks: (..., 12) bytes ->
    two (..., 8) uint8 arrays. Groups 0-3 keep theirs in the low six bits of bytes 0-3
    (scales) and 4-7 (mins); groups 4-7 take their low four bits from the nibbles of bytes
    8-11 and their top two from the spare top bits of bytes 0-3 and 4-7."""
    low, high, extra = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([low & 63, (extra & 15) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([high & 63, (extra >> 4) | ((high >> 6) << 4)], axis=-1)
    return scales, mins


def affine_groups(ttype, shape, raw):
    """A quantized 2-D (or higher) tensor as ``(q, scale, bias)`` per group of 32:
    ``q`` uint8 of shape (*rows, groups, 32) in element order, ``scale`` and ``bias`` of
    shape (*rows, groups, 1), f16 for the 32-weight types and float32 for the K-quants.
    ``raw`` holds the tensor's blocks (uint8); ``shape`` is numpy order (row length last)."""
    bits, size, per_block = AFFINE_TYPES[ttype]
    rows, length = tuple(shape[:-1]), shape[-1]
    blocks = raw.reshape(*rows, length // per_block, size)
    d = _f16(blocks[..., 0:2])
    if ttype == 8:  # Q8_0: w = d * int8  ->  q = int8 + 128 (the byte ^ 0x80), bias -128 d
        return blocks[..., 2:] ^ np.uint8(0x80), d, _offset_bias(d, 128)
    if ttype == 2:  # Q4_0: w = d * (nibble - 8)
        return _nibbles(blocks[..., 2:]), d, _offset_bias(d, 8)
    if ttype == 3:  # Q4_1: w = d * nibble + m
        return _nibbles(blocks[..., 4:]), d, _f16(blocks[..., 2:4])
    if ttype == 6:  # Q5_0: w = d * (q5 - 16)
        q = _nibbles(blocks[..., 6:]) | _fifth_bits(blocks[..., 2:6])
        return q, d, _offset_bias(d, 16)
    if ttype == 7:  # Q5_1: w = d * q5 + m
        return _nibbles(blocks[..., 8:]) | _fifth_bits(blocks[..., 4:8]), d, _f16(blocks[..., 2:4])
    # K-quants: super-block -> 8 groups of 32. The nibbles come in four runs of 32 bytes,
    # run r holding group 2r in its low nibbles and group 2r + 1 in its high ones.
    dmin = _f16(blocks[..., 2:4]).astype(np.float32)
    sc, mn = _k_scales_mins(blocks[..., 4:16])
    nibble_start = 16 if ttype == 12 else 48
    runs = blocks[..., nibble_start:nibble_start + 128].reshape(*rows, -1, 4, 1, 32)
    q = (runs >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15  # (..., 4 runs, 2, 32)
    q = q.reshape(*rows, -1, 8, 32)
    if ttype == 13:  # Q5_K: byte l of the 32 high-bit bytes holds bit 4 of element l of group g in bit g
        qh = blocks[..., 16:48].reshape(*rows, -1, 1, 32)
        q = q | (((qh >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1) << 4)
    scale = d.astype(np.float32) * sc.astype(np.float32)  # (..., super-blocks, 8)
    bias = -(dmin * mn.astype(np.float32))
    groups = length // GROUP_SIZE
    return (q.reshape(*rows, groups, GROUP_SIZE), scale.reshape(*rows, groups, 1),
            bias.reshape(*rows, groups, 1))


def pack(q, bits):
    """MLX's packing of ``bits``-bit values (uint8, last axis a multiple of 8) into uint32
    words: a little-endian bit stream, element i in bits ``[i * bits, (i + 1) * bits)``."""
    if bits == 8:
        packed = q
    elif bits == 4:  # element 2i in the low nibble of byte i (a quick path for the common case)
        packed = q[..., 0::2] | (q[..., 1::2] << 4)
    else:
        packed = _pack_octets(q, bits)
    return np.ascontiguousarray(packed).reshape(*q.shape[:-1], -1).view(np.uint32)


def _pack_octets(q, bits):
    """Any width: each eight values fill exactly ``bits`` bytes."""
    octets = q.reshape(*q.shape[:-1], -1, 8).astype(np.uint64)
    stream = np.zeros(octets.shape[:-1], np.uint64)
    for k in range(8):
        stream |= octets[..., k] << np.uint64(bits * k)
    return stream[..., None].view(np.uint8)[..., :bits]  # little-endian: low bytes first


def to_mlx_affine(ttype, shape, raw):
    """MLX affine triple ``(weight uint32, scales, biases)`` and ``bits`` of a tensor of one
    of :data:`AFFINE_TYPES`; rows keep their order (so a row permutation applies to all)."""
    q, scale, bias = affine_groups(ttype, shape, raw)
    rows = tuple(shape[:-1])
    bits = AFFINE_TYPES[ttype][0]
    return pack(q.reshape(*rows, -1), bits), scale.reshape(*rows, -1), bias.reshape(*rows, -1), bits


def to_float32(ttype, shape, raw):
    """A tensor of one of :data:`AFFINE_TYPES` dequantized with ggml's float32 arithmetic."""
    q, scale, bias = affine_groups(ttype, shape, raw)
    return (scale.astype(np.float32) * q + bias.astype(np.float32)).reshape(shape)
