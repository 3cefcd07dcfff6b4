"""The shared attention layer: GQA, QK-norm variants, RoPE, soft-capping, sinks, and
decode attention by row groups. Parameter names follow Hugging Face checkpoints
(``self_attn.q_proj`` ...). A model states its variant in three named parts
(``attention_options.py``: :class:`QKNorm`, :class:`Projections`, :class:`Scores`)."""

import mlx.core as mx
import mlx.nn as nn

from . import cpu_ops
from .attention_options import OutputGate, Projections, QKNorm, Scores
from .quantized_attention import quantized_attention
from ..cache.kv import update_kv
from ..cache.row_blocks import KVSegments


def scaled_dot_product_attention(q, k, v, scale, mask, softcap=None, sinks=None):
    """Attention over ``(B, H, L, D)`` queries; keys/values may have fewer heads (GQA).

    ``mask`` is boolean (True = attend). Soft-capped logits need the explicit path.
    ``sinks``: ``(H,)`` learned logits of an extra key with no value (GPT-OSS).
    Keys and values that are ``(packed, scales, biases)`` triples (a quantized cache)
    are attended quantized (``quantized_attention.py``).
    """
    if isinstance(k, KVSegments):  # consecutive slots in several arrays (a shared prefix)
        if cpu_ops.fused_decode(q, k, v, mask, softcap) and sinks is None:
            return cpu_ops.attention(q, k, v, scale, mask, softcap)  # read in place
        # Elsewhere the segments are joined: the seam for a paged attention kernel.
        k, v = mx.concatenate(k, axis=2), mx.concatenate(v, axis=2)
    if isinstance(k, tuple):
        if sinks is not None:
            raise NotImplementedError("attention sinks over a quantized KV cache (kv_bits)")
        return quantized_attention(q, k, v, scale, mask, softcap)
    if softcap is None and (sinks is not None or mx.default_device() != mx.cpu):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    if sinks is not None:
        raise NotImplementedError("attention sinks with soft-capping")
    # Soft-capping, and the CPU backend (where mx.fast falls back to unfused ops that
    # repeat the keys per query head): the explicit attention of cpu_ops.
    return cpu_ops.attention(q, k, v, scale, mask, softcap)


def grouped_attention(q, k, v, scale, mask, softcap, sinks, groups):
    """Attention by contiguous row groups ``(start, stop, first_slot)``: each group
    skips the key slots before ``first_slot``, padding (masked) for all its rows.
    ``k``/``v``: all rows' keys and values, or per group its rows' from ``first_slot``
    on (a cache stored by row blocks, ``KVCache.update_and_fetch_groups``), possibly as
    a list of segments (a block sharing a prefix's KV blocks, ``cache/row_blocks.py``)."""
    outs = []
    for i, (start, stop, first) in enumerate(groups):
        rows = slice(start, stop)
        if isinstance(k, list):
            k_g, v_g = k[i], v[i]
        else:
            k_g, v_g = k[rows, :, first:], v[rows, :, first:]
        mask_g = None if mask is None else mask[rows, ..., first:]
        outs.append(scaled_dot_product_attention(q[rows], k_g, v_g, scale, mask_g, softcap,
                                                 sinks))
    return mx.concatenate(outs, axis=0)


def step_row_groups(attention, q, mask):
    """The step's decode row groups when grouped attention applies to queries ``q``
    ``(B, heads, L, D)`` under ``mask``: one query per row and a per-row mask (or none)."""
    B, _, L, _ = q.shape
    groups = attention.row_groups if attention is not None and L == 1 else None
    if groups and (mask is None or (isinstance(mask, mx.array) and mask.ndim == 4
                                    and mask.shape[0] == B)):
        return groups
    return None


def heads_first(t, heads):
    """A ``(B, L, heads * D)`` projection as ``(B, heads, L, D)``. With one column
    (decode) that is a reshape alone: the same memory order, and one graph node where
    a reshape and a transpose take two (a decode step is bound by its node count on
    the CPU)."""
    B, L, _ = t.shape
    if L == 1:
        return t.reshape(B, heads, 1, -1)
    return t.reshape(B, L, heads, -1).transpose(0, 2, 1, 3)


class Attention(nn.Module):
    """Multi-head attention with GQA, optional QK-norm, RoPE and soft-capping."""

    has_kv = True  # projects its own keys and values (mlx-lm's Gemma attribute)

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, rope=None, qk_norm=None,
                 projections=Projections(), scores=Scores()):
        """``qk_norm``: a :class:`QKNorm` (None: no norm); ``projections``: a
        :class:`Projections`; ``scores``: a :class:`Scores` (``attention_options.py``
        says what each holds). Attention over another layer's keys and values (KV
        sharing) is :class:`~.kv_sharing.SharedKVAttention`."""
        super().__init__()
        if qk_norm is not None and not isinstance(qk_norm, QKNorm):
            raise ValueError(f"qk_norm must be a QKNorm or None, got {qk_norm!r}")
        if not isinstance(projections, Projections):
            raise ValueError(f"projections must be a Projections, got {projections!r}")
        if not isinstance(scores, Scores):
            raise ValueError(f"scores must be a Scores, got {scores!r}")
        p = projections
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.fused_qkv, self.qkv_name = p.fused_qkv, p.qkv_name
        if p.fused_qkv:
            setattr(self, p.qkv_name,
                    nn.Linear(hidden_size, (n_heads + 2 * n_kv_heads) * head_dim, bias=p.bias))
        else:
            self.q_proj = nn.Linear(hidden_size, n_heads * head_dim, bias=p.bias)
            self.k_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=p.bias)
            if not p.values_from_keys:
                self.v_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=p.bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden_size,
                                bias=p.bias if p.o_bias is None else p.o_bias)
        self.has_qk_norm = qk_norm is not None
        self.qk_norm_names = qk_norm.names if self.has_qk_norm else QKNorm.names
        self.qk_norm_full = self.has_qk_norm and qk_norm.full
        self.qk_norm_after_rope = self.has_qk_norm and qk_norm.after_rope
        if self.has_qk_norm:
            q_dims, k_dims = ((n_heads * head_dim, n_kv_heads * head_dim) if qk_norm.full
                              else (head_dim,) * 2)
            setattr(self, qk_norm.names[0], qk_norm.factory(q_dims))
            setattr(self, qk_norm.names[1], qk_norm.factory(k_dims))
        self.rope = rope
        self.scale = scores.scale if scores.scale is not None else head_dim**-0.5
        self.softcap = scores.softcap
        self.clip_qkv = p.clip
        self.position_scale = scores.position_scale
        self.v_norm = p.v_norm
        self.values_from_keys = p.values_from_keys
        if scores.sinks:  # per-head attention-sink logits (GPT-OSS)
            self.sinks = mx.zeros((n_heads,))

    def __call__(self, x, mask, offset, cache=None, attention=None, output_gate=None):
        """``attention``: the step's :class:`~.base.StepAttention` (or None);
        ``output_gate``: ``(B, L, heads * head_dim)`` factors on the heads' output
        before ``o_proj`` (:class:`OutputGatedAttention`)."""
        q, k, v = self.project(x)
        return self.attend_projections(q, k, v, mask, offset, cache, attention, output_gate)

    def attend_projections(self, q, k, v, mask, offset, cache=None, attention=None,
                           output_gate=None):
        """Attention from the ``(B, L, heads * head_dim)`` query, key and value
        projections (a family that transforms them first, as Baichuan-M1's key/value
        convolution, calls this after)."""
        L = q.shape[1]
        q = self._heads(q, 0, offset)
        if self.position_scale is not None:
            # Padding columns have negative positions: clamp them to 0 (a finite
            # factor; their outputs are never read).
            positions = mx.maximum(offset[:, None] + mx.arange(L), 0)
            q = q * self.position_scale(positions)[:, None, :, None].astype(q.dtype)
        k = self._heads(k, 1, offset)
        if self.clip_qkv is not None:
            v = mx.clip(v, -self.clip_qkv, self.clip_qkv)
        v = heads_first(v, self.n_kv_heads)
        if self.v_norm is not None:
            v = self.v_norm(v)
        if cache is not None:
            groups = step_row_groups(attention, q, mask)
            if groups and getattr(cache, "blocks", None) is not None:
                # Stored by row blocks: each group's keys come from its block.
                k, v = cache.update_and_fetch_groups(k, v, groups)
            else:
                k, v = update_kv(cache, k, v, offset)
        return self._attend(q, k, v, mask, attention, output_gate)

    def _attend(self, q, k, v, mask, attention, output_gate=None):
        """Attention of the rotated queries ``(B, heads, L, D)`` over the fetched keys
        and values, times ``output_gate`` when given, then ``o_proj``."""
        B, _, L, _ = q.shape
        sinks = self.sinks.astype(q.dtype) if "sinks" in self else None
        groups = step_row_groups(attention, q, mask)
        if groups and sinks is None and not isinstance(k, list) and \
                cpu_ops.fused_decode(q, k, v, mask, self.softcap):
            groups = None  # one fused call skips every row's padding itself
        if groups:
            out = grouped_attention(q, k, v, self.scale, mask, self.softcap, sinks, groups)
        else:
            out = scaled_dot_product_attention(q, k, v, self.scale, mask, self.softcap, sinks)
        if L == 1 and type(self).head_outputs is Attention.head_outputs:
            out = out.reshape(B, 1, -1)  # one query: heads-first is already row order
        else:
            out = self.head_outputs(out.transpose(0, 2, 1, 3)).reshape(B, L, -1)
        if output_gate is not None:
            out = out * output_gate
        return self.output(out)

    def head_outputs(self, out):
        """The heads' outputs ``(B, L, heads, head_dim)`` before the output gate and
        ``o_proj``: unchanged here (Muse Spark's attention norms each head's)."""
        return out

    def output(self, h):
        """The output projection of the heads' concatenated outputs ``h`` (BitNet
        norms them first)."""
        return cpu_ops.linear(self.o_proj, h)

    def _heads(self, t, which, offset):
        """Query (``which`` 0) or key (1) projection ``t`` ``(B, L, heads * D)`` as
        normed, rotated ``(B, heads, L, D)`` heads."""
        norm = getattr(self, self.qk_norm_names[which]) if self.has_qk_norm else None
        if norm is not None and self.qk_norm_full:
            t = norm(t)
        if self.clip_qkv is not None:  # after a whole-projection QK-norm (OLMoE)
            t = mx.clip(t, -self.clip_qkv, self.clip_qkv)
        t = heads_first(t, self.n_kv_heads if which else self.n_heads)
        if norm is not None and not (self.qk_norm_full or self.qk_norm_after_rope):
            t = norm(t)  # per head: over the last axis, whatever the order of the others
        if self.rope is not None:
            t = self.rope(t, offset)
        if norm is not None and self.qk_norm_after_rope:
            t = norm(t)
        return t

    def project(self, x):
        """The ``(B, L, heads * head_dim)`` query, key and value projections of ``x``
        (cross-layer attention overrides where keys and values come from)."""
        if self.fused_qkv:
            nq, nk = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
            qkv = cpu_ops.linear(getattr(self, self.qkv_name), x)
            return mx.split(qkv, [nq, nq + nk], axis=-1)
        if self.values_from_keys:
            q, k = cpu_ops.linears((self.q_proj, self.k_proj), x)
            return q, k, k
        return tuple(cpu_ops.linears((self.q_proj, self.k_proj, self.v_proj), x))

    def _qk_norm(self, q, k):
        q_name, k_name = self.qk_norm_names
        return getattr(self, q_name)(q), getattr(self, k_name)(k)


class OutputGatedAttention(Attention):
    """The shared attention with an output gate from its own projection of ``x``
    (:class:`OutputGate`: which function, per head or per feature, its name) scaling
    the heads' output before ``o_proj``."""

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, rope,
                 output_gate=OutputGate(), **kwargs):
        """``kwargs``: :class:`Attention`'s parts (``qk_norm``, ``projections``,
        ``scores``)."""
        if not isinstance(output_gate, OutputGate):
            raise ValueError(f"output_gate must be an OutputGate, got {output_gate!r}")
        super().__init__(hidden_size, n_heads, n_kv_heads, head_dim, rope, **kwargs)
        g = output_gate
        self.gate, self.per_head, self.gate_name = g.kind, g.per_head, g.name
        setattr(self, g.name, nn.Linear(hidden_size, n_heads * (1 if g.per_head else head_dim),
                                        bias=g.bias))

    def __call__(self, x, mask, offset, cache=None, attention=None):
        g = getattr(self, self.gate_name)(x)
        if self.gate == "sigmoid":
            g = mx.sigmoid(g.astype(mx.float32)).astype(x.dtype)
        else:  # softplus in float32, as Laguna's reference computes it
            g = mx.logaddexp(g.astype(mx.float32), mx.array(0.0, mx.float32)).astype(x.dtype)
        if self.per_head:
            g = mx.repeat(g, self.head_dim, axis=-1)
        return super().__call__(x, mask, offset, cache, attention, output_gate=g)
