"""The shared attention layer: GQA, QK-norm variants, RoPE, soft-capping, sinks, and
decode attention by row groups. Parameter names follow Hugging Face checkpoints
(``self_attn.q_proj`` ...)."""

import mlx.core as mx
import mlx.nn as nn

from . import cpu_ops
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

    def __init__(
        self,
        hidden_size,
        n_heads,
        n_kv_heads,
        head_dim,
        rope=None,
        bias=False,
        o_bias=None,
        scale=None,
        qk_norm=None,
        softcap=None,
        qk_norm_full=False,
        qk_norm_after_rope=False,
        qk_norm_names=("q_norm", "k_norm"),
        fused_qkv=False,
        sinks=False,
        clip_qkv=None,
        position_scale=None,
        v_norm=None,
        values_from_keys=False,
        qkv_name="qkv_proj",
    ):
        """``qk_norm_full``: norm the whole q/k projection, not each head (OLMo 2).
        ``qk_norm_after_rope``: norm the rotated q/k (Hunyuan). ``qk_norm_names``:
        the checkpoint's names for the two norms. ``fused_qkv``: one projection holding
        q, k then v (Phi 3; sanitize maps other fused layouts to it), named ``qkv_name``
        (Baichuan's ``W_pack``).
        ``clip_qkv``: clamp the q/k/v projections to ``[-clip, clip]`` (OLMo, DBRX).
        ``position_scale``: ``f(positions (B, L)) -> (B, L)`` factors on the rotated
        queries (Llama 4's and Ministral 3's long-context temperature).
        ``v_norm``: a function on the per-head values ``(B, L, heads, head_dim)`` (Gemma
        3n's and 4's RMS norm without weight). ``values_from_keys``: no ``v_proj``; the
        values are the key projection before its norm and RoPE (Gemma 4's
        ``attention_k_eq_v``). Attention over another layer's keys and values (KV
        sharing) is :class:`~.kv_sharing.SharedKVAttention`."""
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.fused_qkv, self.qkv_name = fused_qkv, qkv_name
        if fused_qkv:
            setattr(self, qkv_name,
                    nn.Linear(hidden_size, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias))
        else:
            self.q_proj = nn.Linear(hidden_size, n_heads * head_dim, bias=bias)
            self.k_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=bias)
            if not values_from_keys:
                self.v_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden_size, bias=bias if o_bias is None else o_bias)
        self.qk_norm_names = qk_norm_names
        if qk_norm is not None:  # a factory: qk_norm(dims) -> norm module
            q_dims, k_dims = (n_heads * head_dim, n_kv_heads * head_dim) if qk_norm_full else (head_dim,) * 2
            setattr(self, qk_norm_names[0], qk_norm(q_dims))
            setattr(self, qk_norm_names[1], qk_norm(k_dims))
        self.has_qk_norm = qk_norm is not None
        self.qk_norm_full = qk_norm_full
        self.qk_norm_after_rope = qk_norm_after_rope
        self.rope = rope
        self.scale = scale if scale is not None else head_dim**-0.5
        self.softcap = softcap
        self.clip_qkv = clip_qkv
        self.position_scale = position_scale
        self.v_norm = v_norm
        self.values_from_keys = values_from_keys
        if sinks:  # per-head attention-sink logits (GPT-OSS)
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
        k = cpu_ops.linear(self.k_proj, x)
        q = cpu_ops.linear(self.q_proj, x)
        return q, k, k if self.values_from_keys else cpu_ops.linear(self.v_proj, x)

    def _qk_norm(self, q, k):
        q_name, k_name = self.qk_norm_names
        return getattr(self, q_name)(q), getattr(self, k_name)(k)


class OutputGatedAttention(Attention):
    """The shared attention with an output gate from its own projection of ``x``: the
    heads' output is scaled by ``sigmoid`` (AFMoE) or ``softplus`` (Laguna) of it
    before ``o_proj``; ``per_head``: one gate per head (broadcast over its features)
    instead of one per feature. ``gate_name``: the checkpoint's name of the projection."""

    GATES = ("sigmoid", "softplus")

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, rope, gate="sigmoid",
                 per_head=False, gate_name="gate_proj", gate_bias=False, **kwargs):
        super().__init__(hidden_size, n_heads, n_kv_heads, head_dim, rope, **kwargs)
        if gate not in self.GATES:
            raise ValueError(f"unknown attention output gate '{gate}' (known: {self.GATES})")
        self.gate, self.per_head, self.gate_name = gate, per_head, gate_name
        setattr(self, gate_name, nn.Linear(hidden_size, n_heads * (1 if per_head else head_dim),
                                           bias=gate_bias))

    def __call__(self, x, mask, offset, cache=None, attention=None):
        g = getattr(self, self.gate_name)(x)
        if self.gate == "sigmoid":
            g = mx.sigmoid(g.astype(mx.float32)).astype(x.dtype)
        else:  # softplus in float32, as Laguna's reference computes it
            g = mx.logaddexp(g.astype(mx.float32), mx.array(0.0, mx.float32)).astype(x.dtype)
        if self.per_head:
            g = mx.repeat(g, self.head_dim, axis=-1)
        return super().__call__(x, mask, offset, cache, attention, output_gate=g)
