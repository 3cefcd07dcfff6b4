"""Attention, softmax and SiLU formulated for MLX's CPU backend.

MLX's CPU backend evaluates ``exp`` (and ``sigmoid``, ``softmax``) one element at a
time, at 20-40 ns per element on x86-64, while multiplies and adds run vectorised
at well under 1 ns. Attention softmax (rows x heads x queries x keys exponentials
per layer) and SiLU then take a large share of a CPU forward pass. ``exp`` here
computes ``2^(x log2 e)`` as a power of two, built from the float's exponent bits,
times a degree-7 polynomial, using only vectorised ops, as accurate as ``mx.exp``
(both are limited by the rounding of ``x log2 e``).

Other devices use MLX's own kernels. On the CPU the formulas here serve every array,
whatever its size: a formula chosen by size would give the same token different
logits in a bigger batch or a longer prefill chunk (batch invariance,
docs/architecture.md).

Each formula is ~25 ops, and at small batches a decode step is bound by its op count
(each op is dispatched alone, whatever its size): on the CPU they run fused by
``mx.compile`` (two kernels around the one op that cannot be traced shapeless, the
view of the exponent bits). MLX builds fused CPU kernels with the system's C++ compiler
once per machine (cached under the temp directory); without a compiler, or with
``MLX_LM_BATCHED_COMPILE=0``, the same ops run unfused, with the same bits.

``attention`` is the explicit attention used on the CPU (and for soft-capping); a
decode step's (one query per row, float32, no soft-capping) is one fused primitive
where ``_cpu_prims`` builds (``native/decode_attention.cpp``). Otherwise
each KV head's query heads share one matmul (``mx.fast``'s CPU fallback repeats the
keys per query head), and queries go in chunks so the score tensor, and the
softmax's temporaries, stay small whatever the prompt length. Under a causal mask
(``masks.CausalMask``) each chunk also stops at its last query's key, and starts at its
first query's window.
"""

import math
import os

import mlx.core as mx
import mlx.nn as nn

from .. import _cpu_prims
from .masks import CausalMask

LOG2E = 1.4426950408889634
# Taylor coefficients of 2^f = exp(f ln 2); |f| <= 1/2 keeps the error near 5e-9.
_POLY = [math.log(2) ** k / math.factorial(k) for k in range(8)]
# Attention scores computed at once (elements, 4 MB): bounds the transient memory of
# long prompts (a few such arrays per chunk). Each chunk costs about a dozen ops, so
# smaller chunks cost dispatches: 512 KB chunks (37 per layer for a (8, 256) prefill)
# made SmolLM2's prefill 15-20% slower at batch 4 and 8, and 17% at 1024 tokens
# (2-core AMD EPYC, OpenBLAS, with _malloc's thresholds; batch 1 at 256 tokens equal).
SCORE_CHUNK = 1 << 20
# Queries per block under a CausalMask: each block attends only the keys up to its last
# query's, so smaller blocks skip more (n blocks do (n + 1) / 2n of the full work) but
# cost a dozen ops each. 64 made SmolLM2's prefill 1.2-1.4x faster at 256-1024 tokens
# (2-core AMD EPYC, OpenBLAS; scripts/bench_prefill.py).
CAUSAL_QUERY_BLOCK = 64
# "0": run the formulas below as separate ops, not fused by mx.compile.
COMPILE_ENV = "MLX_LM_BATCHED_COMPILE"
_fused_ok = None  # decided at first use (fused())


def use_fast(x):
    """True on the CPU, for arrays of every size (see the module docstring)."""
    return mx.default_device() == mx.cpu


def _exp_head(x):
    """``(p, bits)``: ``exp(x) = p * bits.view(float32)`` (float32 ``p`` in [0.7, 1.5],
    ``bits`` the int32 pattern of a power of two)."""
    t = mx.clip(x.astype(mx.float32) * LOG2E, -127.0, 127.49)
    m = (t + 127.5).astype(mx.int32)  # round(t) + 127 in [0, 254]: a biased exponent
    f = t - (m - 127).astype(mx.float32)  # in [-1/2, 1/2]
    p = _POLY[-1]
    for c in reversed(_POLY[:-1]):
        p = p * f + c
    # The float whose exponent bits are m is 2^(m - 127) (m = 0 gives 0.0).
    return p, m * (1 << 23)


def _shifted_exp_head(x, shift):
    return _exp_head(x - shift)


def _exp_tail(p, power, dtype):
    return (p * power).astype(dtype)


def _silu_tail(x, p, power):
    return x / (1 + (p * power).astype(x.dtype))


# The same formulas fused by ``mx.compile`` (module functions, never module attributes:
# models must deepcopy and pickle). A decode step at small batches is bound by the count
# of ops, and each formula above is ~25 ops; fused, it is one pass. The view of the
# exponent bits cannot be traced shapeless, so it stays between two compiled parts.
# Fused and unfused give the same bits (tests/test_cpu_ops_compile.py).
_FUSED = {
    "head": mx.compile(_exp_head, shapeless=True),
    "shifted_head": mx.compile(_shifted_exp_head, shapeless=True),
    "silu_tail": mx.compile(_silu_tail, shapeless=True),
}


def fused():
    """True when the CPU formulas run ``mx.compile``d (see :data:`COMPILE_ENV`)."""
    global _fused_ok
    if _fused_ok is None:
        _fused_ok = os.environ.get(COMPILE_ENV, "1").strip() not in ("0", "false", "no")
        if _fused_ok:
            # MLX compiles fused CPU kernels with the system's C++ compiler (cached
            # under the temp directory): without one, keep the unfused ops.
            try:
                p, bits = _FUSED["head"](mx.zeros((2,), dtype=mx.float32))
                mx.eval(p, bits)
            except Exception:  # noqa: BLE001 (any failure: the unfused path is exact)
                _fused_ok = False
    return _fused_ok


def exp(x):
    """``exp(x)``; on CPU exact to float32 rounding for ``x`` in [-87, 88], 0 below,
    and saturating at 2.4e38 (instead of inf) above."""
    if not use_fast(x):
        return mx.exp(x)
    p, bits = (_FUSED["head"] if fused() else _exp_head)(x)
    return _exp_tail(p, bits.view(mx.float32), x.dtype)


def _shifted_exp(x32, shift):
    head = _FUSED["shifted_head"] if fused() else _shifted_exp_head
    p, bits = head(x32, shift)
    return _exp_tail(p, bits.view(mx.float32), mx.float32)


def softmax(x, axis=-1):
    """Softmax along ``axis``, computed in float32 (like ``precise=True``)."""
    if not use_fast(x):
        return mx.softmax(x, axis=axis, precise=True)
    x32 = x.astype(mx.float32)
    e = _shifted_exp(x32, mx.max(x32, axis=axis, keepdims=True))
    return (e / mx.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def log_softmax(x, axis=-1):
    """``x - logsumexp(x)`` along ``axis`` (log-probabilities from logits). On the CPU,
    for float32, with this module's exp: MLX's ``logsumexp`` takes one ``exp`` per
    element (8.4 ms for 8 rows of a 49k vocabulary, 3.0 ms here: a decode step's
    log-probabilities at batch 8 cost 10% of its model call)."""
    if not use_fast(x) or x.dtype != mx.float32:
        return x - mx.logsumexp(x, axis=axis, keepdims=True)
    top = mx.max(x, axis=axis, keepdims=True)
    return x - (top + mx.log(mx.sum(_shifted_exp(x, top), axis=axis, keepdims=True)))


def silu(x):
    """``x * sigmoid(x)``."""
    if not use_fast(x):
        return x * mx.sigmoid(x)
    p, bits = (_FUSED["head"] if fused() else _exp_head)(-x)
    return (_FUSED["silu_tail"] if fused() else _silu_tail)(x, p, bits.view(mx.float32))


def linear(layer, x):
    """``layer(x)``. For a plain ``mlx.nn.Linear`` on the CPU in float32, one primitive
    node with the same bits (``_cpu_prims.linear``) instead of the four MLX builds
    (transpose, flatten, matmul, unflatten); for an affine 4- or 8-bit
    ``mlx.nn.QuantizedLinear`` on the CPU (float32, float16 or bfloat16 input), the
    quantized primitive (several times MLX's CPU ``quantized_matmul``, to float32
    rounding); any other layer (LoRA, a subclass) is called as it is."""
    if type(layer) is nn.Linear:
        out = _cpu_prims.linear(x, layer.weight, layer.get("bias"))
        if out is not None:
            return out
    elif type(layer) is nn.QuantizedLinear and layer.mode == "affine":
        out = _cpu_prims.quantized_linear(x, layer.weight, layer.scales, layer.get("biases"),
                                          layer.get("bias"), layer.group_size, layer.bits)
        if out is not None:
            return out
    return layer(x)


def linears(layers, x):
    """``[layer(x) for layer in layers]``. Where every layer is an affine
    ``mlx.nn.QuantizedLinear`` of one width and group on the CPU, one primitive computes
    them all (a decode step's rows of every layer in one parallel region: a layer's query,
    key and value projections, a gated MLP's gate and up), each output with the bits
    :func:`linear` gives it; otherwise each layer as :func:`linear` computes it."""
    if all(type(layer) is nn.QuantizedLinear and layer.mode == "affine" for layer in layers):
        out = _cpu_prims.quantized_linears(x, [
            (layer.weight, layer.scales, layer.get("biases"), layer.get("bias"),
             layer.group_size, layer.bits) for layer in layers])
        if out is not None:
            return out
    return [linear(layer, x) for layer in layers]


def tied_logits(embedding, h):
    """``embedding.as_linear(h)``; for a plain ``mlx.nn.Embedding`` on the CPU in
    float32, the linear primitive (the same bits, one node); for an affine quantized one,
    the quantized primitive."""
    if type(embedding) is nn.Embedding:
        out = _cpu_prims.linear(h, embedding.weight)
        if out is not None:
            return out
    elif type(embedding) is nn.QuantizedEmbedding and embedding.mode == "affine":
        out = _cpu_prims.quantized_linear(h, embedding.weight, embedding.scales,
                                          embedding.get("biases"), None,
                                          embedding.group_size, embedding.bits)
        if out is not None:
            return out
    return embedding.as_linear(h)


def swiglu(gate, up):
    """``silu(gate) * up``; on the CPU in float32, one primitive node with this
    module's SiLU formula (about ten nodes composed)."""
    if use_fast(gate):
        out = _cpu_prims.swiglu(gate, up)
        if out is not None:
            return out
    return silu(gate) * up


def fused_decode(q, k, v, mask, softcap=None):
    """True when :func:`attention` computes this one fused decode-attention primitive
    (masked slots skipped, so row groups need not slice the padding away)."""
    return softcap is None and _cpu_prims.serves(q, k, v, mask)


def attention(q, k, v, scale, mask=None, softcap=None):
    """Attention over ``(B, H, L, D)`` queries and ``(B, n_kv, S, D)`` keys/values
    (GQA when ``n_kv < H``). ``mask``: boolean (True = attend) or additive,
    broadcastable to ``(B, 1 or H, L, S)``; ``softcap``: tanh soft-capping of logits.
    Under a :class:`~.masks.CausalMask` each block of queries reads only the keys up to
    its last query's slot, and with a window none before its first query's window (the
    rest are masked for all of them)."""
    B, H, L, _ = q.shape
    if fused_decode(q, k, v, mask, softcap):
        return _cpu_prims.attend(q, k, v, scale, mask)
    if q.dtype in _cpu_prims.HALF_FLOATS and mx.default_device() == mx.cpu:
        # The CPU's half-precision matmuls skip the BLAS (bfloat16 prefill of SmolLM2 ran
        # at half the float32 speed): scores, softmax and weighted sum in float32, the
        # output rounded once to the queries' dtype.
        dtype = q.dtype
        return attention(q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32),
                         scale, mask, softcap).astype(dtype)
    S = k.shape[2]
    step = max(1, SCORE_CHUNK // (B * H * S))
    causal = isinstance(mask, CausalMask) and mask.shape[-2:] == (L, S)
    if causal:
        step = min(step, CAUSAL_QUERY_BLOCK)
    if L <= step:
        return _attention(q, k, v, scale, mask, softcap)
    outs = []
    for start in range(0, L, step):
        stop = min(start + step, L)
        rows = slice(start, stop)
        k_block, v_block, m = k, v, mask
        if causal:
            end = S - L + stop  # one past the last query's own key
            # The first query's window starts here (the keys before it are masked).
            first = max(0, S - L + start - mask.window + 1) if mask.window else 0
            keys = slice(first, end)
            k_block, v_block, m = k[:, :, keys], v[:, :, keys], m[..., rows, keys]
        elif m is not None and m.ndim >= 2 and m.shape[-2] == L:
            m = m[..., rows, :]
        q_block = q[:, :, rows]
        if outs:
            # Block by block: MLX evaluates independent branches breadth first (up to
            # 20 at once), which would hold that many blocks' scores at a time.
            q_block = mx.depends(q_block, outs[-1])
        outs.append(_attention(q_block, k_block, v_block, scale, m, softcap))
    return mx.concatenate(outs, axis=2)


def _attention(q, k, v, scale, mask, softcap):
    B, H, L, D = q.shape
    n_kv = k.shape[1]
    rep = H // n_kv
    scores = (q * scale).reshape(B, n_kv, rep * L, D) @ k.swapaxes(-1, -2)
    if softcap is not None:
        scores = mx.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.reshape(B, n_kv, rep, L, -1)
        if mask.ndim == 4:  # (B, 1 or H, L, S) -> broadcastable over (B, n_kv, rep, L, S)
            b, h, lq, s = mask.shape
            mask = mask.reshape(b, -1, rep if h == H else 1, lq, s)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(scores.dtype).min)
        else:
            scores = scores + mask
        scores = scores.reshape(B, n_kv, rep * L, -1)
    return (softmax(scores, axis=-1) @ v).reshape(B, H, L, v.shape[-1])
