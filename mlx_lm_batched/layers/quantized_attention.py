"""Attention over quantized keys and values (``cache/quantized.py``).

The keys and values stay quantized: scores are ``mx.quantized_matmul`` of the queries
with the packed keys, and the output the same product of the probabilities with the
packed values, as mlx-lm's ``quantized_scaled_dot_product_attention`` computes them.
Each row, head and query is its own product, so a row's result does not depend on the
batch. The softmax is ``cpu_ops.softmax`` (one formula for every array size).
"""

import mlx.core as mx

from . import cpu_ops


def quantization_of(q, keys):
    """``(group_size, bits)`` of quantized ``keys`` ``(packed, scales, biases)`` attended
    by queries ``q`` of head dimension ``D`` (``packed`` holds ``D * bits / 32`` words,
    ``scales`` ``D / group_size`` entries)."""
    D = q.shape[-1]
    return D // keys[1].shape[-1], keys[0].shape[-1] * 32 // D


def quantized_attention(q, keys, values, scale, mask=None, softcap=None):
    """Attention of ``(B, H, L, D)`` queries over quantized ``(B, n_kv, S, .)`` key and
    value triples (GQA when ``n_kv < H``). ``mask``: boolean (True = attend) or
    additive, broadcastable to ``(B, 1 or H, L, S)``; ``softcap``: tanh soft-capping."""
    group_size, bits = quantization_of(q, keys)
    B, H, L, D = q.shape
    n_kv = keys[0].shape[1]
    rep = H // n_kv
    # (B, n_kv, rep, L, D) queries against (B, n_kv, 1, S, .) keys: GQA without copies.
    q = (q * scale).reshape(B, n_kv, rep, L, D)
    keys = tuple(mx.expand_dims(x, 2) for x in keys)
    values = tuple(mx.expand_dims(x, 2) for x in values)
    scores = mx.quantized_matmul(q, *keys, transpose=True, group_size=group_size, bits=bits)
    if softcap is not None:
        scores = mx.tanh(scores / softcap) * softcap
    if mask is not None:
        if mask.ndim == 4:  # (B, 1 or H, L, S) -> broadcastable over (B, n_kv, rep, L, S)
            b, h, lq, s = mask.shape
            mask = mask.reshape(b, -1, rep if h == H else 1, lq, s)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    probs = cpu_ops.softmax(scores, axis=-1)
    out = mx.quantized_matmul(probs, *values, transpose=False, group_size=group_size, bits=bits)
    return out.reshape(B, H, L, -1)
