"""Multi-head latent attention (DeepSeek V2/V3 and their derivatives).

Queries come from a full projection or a low-rank one (``q_a_proj`` -> norm ->
``q_b_proj``). Keys and values come from one compressed latent per token
(``kv_a_proj_with_mqa`` gives the latent plus a single shared rotary key part);
``kv_b_proj`` expands the normed latent into per-head non-rotary keys and values.
Only the last ``qk_rope_head_dim`` features of each query/key head are rotated.

The cache stores the expanded per-head keys ``concat(nope, rope)`` and values (whose
head dim may differ from the keys'), so masks, caches and batching work unchanged.
"""

import math
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import update_kv
from .attention import scaled_dot_product_attention
from .norms import RMSNorm

# DeepSeek's latent norms use this eps whatever rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


def _yarn_mscale(factor, mscale):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(qk_head_dim, rope_scaling=None):
    """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` with yarn.

    DeepSeek scales the attention logits of scaled-RoPE checkpoints by the squared
    ``mscale_all_dim`` correction (the rotary part itself gets the ``mscale`` ratio).
    """
    scale = qk_head_dim**-0.5
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
        mscale_all_dim = rope_scaling.get("mscale_all_dim", 0)
        if rope_type not in (None, "default") and mscale_all_dim:
            m = _yarn_mscale(rope_scaling["factor"], mscale_all_dim)
            scale = scale * m * m
    return scale


@dataclass(frozen=True)
class LatentDims:
    """The widths of multi-head latent attention: each query/key head's non-rotary
    (``qk_nope_head_dim``) and rotary (``qk_rope_head_dim``) features, each value
    head's (``v_head_dim``), the key/value latent's (``kv_lora_rank``) and the
    low-rank query's (``q_lora_rank``; None: a full query projection)."""

    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int
    q_lora_rank: Optional[int] = None

    def __post_init__(self):
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank",
                     "q_lora_rank"):
            value = getattr(self, name)
            if value is None and name == "q_lora_rank":
                continue
            least = 0 if name == "qk_nope_head_dim" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"LatentDims {name} must be an integer >= {least}, "
                                 f"got {value!r}")

    @classmethod
    def from_args(cls, args):
        """The widths a DeepSeek-style config names (the same five keys)."""
        return cls(args.qk_nope_head_dim, args.qk_rope_head_dim, args.v_head_dim,
                   args.kv_lora_rank, args.q_lora_rank)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, hidden_size, n_heads, dims, rope=None, scale=None, bias=False,
                 output_gate=False, position_scale=None):
        """``dims``: the :class:`LatentDims`; ``scale``: of the logits (default
        ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``); ``bias``: of ``q_a_proj``,
        ``kv_a_proj_with_mqa`` and ``o_proj``. ``output_gate``: scale each head's output
        by ``sigmoid(g_proj(x))``, one gate per head (Bailing V3; ``True`` or ``"head"``)
        or one per output feature (Kimi K3; ``"feature"``). ``position_scale``: ``f(positions (B, L)) -> (B, L)``
        factors on the queries (Mistral 4's Llama-4 long-context temperature)."""
        super().__init__()
        if not isinstance(dims, LatentDims):
            raise ValueError(f"MultiHeadLatentAttention dims must be a LatentDims, got {dims!r}")
        qk_nope_head_dim, qk_rope_head_dim = dims.qk_nope_head_dim, dims.qk_rope_head_dim
        v_head_dim, kv_lora_rank, q_lora_rank = dims.v_head_dim, dims.kv_lora_rank, dims.q_lora_rank
        self.n_heads = n_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.q_lora_rank = q_lora_rank
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, n_heads * qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_head_dim, hidden_size, bias=bias)
        self.rope = rope
        self.scale = scale if scale is not None else qk_head_dim**-0.5
        if output_gate not in (False, None, True, "head", "feature"):
            raise ValueError(f"unknown MLA output_gate {output_gate!r} (known: 'head', "
                             "'feature')")
        # Gate values per head: 1, or each of its v_head_dim output features.
        self.gate_width = v_head_dim if output_gate == "feature" else 1
        if output_gate:
            self.g_proj = nn.Linear(hidden_size, n_heads * self.gate_width, bias=False)
        self.position_scale = position_scale

    def project(self, x, offset):
        """Rotated ``(B, H, L, D)`` queries (position-scaled) and keys, the values,
        and the normed low-rank query (DeepSeek sparse attention's indexer reads it;
        None without ``q_lora_rank``)."""
        B, L, _ = x.shape
        H, nope = self.n_heads, self.qk_nope_head_dim
        if self.q_lora_rank is None:
            q_resid = None
            q = self.q_proj(x)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_resid)
        q = q.reshape(B, L, H, -1).transpose(0, 2, 1, 3)
        q_nope, q_pe = q[..., :nope], q[..., nope:]

        latent, k_pe = mx.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank], axis=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent))
        kv = kv.reshape(B, L, H, -1).transpose(0, 2, 1, 3)
        k_nope, values = kv[..., :nope], kv[..., nope:]
        k_pe = k_pe.reshape(B, L, 1, -1).transpose(0, 2, 1, 3)  # one rotary key for all heads

        if self.rope is not None:
            q_pe, k_pe = self.rope(q_pe, offset), self.rope(k_pe, offset)
        k_pe = mx.broadcast_to(k_pe, (B, H, L, self.qk_rope_head_dim))
        queries = mx.concatenate([q_nope, q_pe], axis=-1)
        if self.position_scale is not None:
            # Padding columns have negative positions: clamp them to 0 (a finite
            # factor; their outputs are never read).
            positions = mx.maximum(offset[:, None] + mx.arange(L), 0)
            queries = queries * self.position_scale(positions)[:, None, :, None].astype(
                queries.dtype)
        keys = mx.concatenate([k_nope, k_pe], axis=-1)
        return queries, keys, values, q_resid

    def output(self, out, x):
        """``o_proj`` of the attention output ``(B, H, L, v_head_dim)`` (each head
        gated by ``sigmoid(g_proj(x))`` first when the layer has an output gate)."""
        B, _, L, _ = out.shape
        out = out.transpose(0, 2, 1, 3)
        if "g_proj" in self:
            gate = mx.sigmoid(self.g_proj(x).astype(mx.float32)).astype(out.dtype)
            out = out * gate.reshape(B, L, self.n_heads, self.gate_width)
        return self.o_proj(out.reshape(B, L, -1))

    def __call__(self, x, mask, offset, cache=None, attention=None):
        # ``attention`` (decode row groups) is a CPU speed-up the shared Attention
        # takes; one call over every slot gives the same result.
        queries, keys, values, _ = self.project(x, offset)
        if cache is not None:
            keys, values = update_kv(cache, keys, values, offset)
        return self.output(scaled_dot_product_attention(queries, keys, values, self.scale, mask),
                           x)


def merge_absorbed_kv_b(weights, prefix, qk_nope_head_dim, kv_lora_rank):
    """Rebuild ``{prefix}.kv_b_proj.weight`` from mlx-lm's split ``embed_q``
    ``(H, kv_lora_rank, nope)`` and ``unembed_out`` ``(H, v_head_dim, kv_lora_rank)``
    (checkpoints converted by recent mlx-lm), dequantizing them when quantized."""
    if f"{prefix}.embed_q.weight" not in weights:
        return weights
    parts = []
    for name in ("embed_q", "unembed_out"):
        w = weights.pop(f"{prefix}.{name}.weight")
        scales = weights.pop(f"{prefix}.{name}.scales", None)
        biases = weights.pop(f"{prefix}.{name}.biases", None)
        if scales is not None:
            # Affine mode as mlx-lm writes it; bits and group size follow from shapes.
            in_dims = kv_lora_rank if name == "unembed_out" else qk_nope_head_dim
            bits = w.shape[-1] * 32 // in_dims
            w = mx.dequantize(w, scales, biases, group_size=in_dims // scales.shape[-1], bits=bits)
        parts.append(w)
    wk, wv = parts
    kv_b = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1)  # (H, nope + v, kv_lora_rank)
    weights[f"{prefix}.kv_b_proj.weight"] = kv_b.reshape(-1, kv_lora_rank)
    return weights
