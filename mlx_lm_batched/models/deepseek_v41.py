"""DeepSeek V4.1 (``deepseek_v41``; ``deepseek_v41_text``): hyper-connected residual
streams (``layers/hyper_connection.py``), attention over a sliding window plus
compressed, indexer-picked keys (``layers/compressed_attention.py``) and a MoE with
a clamped SwiGLU and ``sqrtsoftplus`` routing.

Compression groups close at absolute positions of each row, so the model runs its
rows one at a time over their real columns (the padding columns' logits are zero);
each layer's per-row state lives in a ``RaggedStateCache`` (window, open group,
compressed keys, index keys), whose lengths follow from the row's position. A row's
result is the same computation whatever the batch, so batching stays exact; the
price is no batched matmuls for this family. Checkpoints in DeepSeek's own names
(``layers.0.attn.wq_a.weight`` ...) are renamed; their FP8/FP4 packed weights are not
supported here (load a dequantized conversion)."""

from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from ..cache.ragged import RaggedStateCache, stack_rows
from ..cache.state import StateCache
from ..layers.compressed_attention import CompressedSparseAttention, TailRope
from ..layers.hyper_connection import HyperConnection, collapse, expand
from ..layers.moe import SwitchGLU
from ..layers.rope import _yarn, rope_wavelengths
from ..layers.step import resolve_offset
from .args import BaseModelArgs

_STATE_KEYS = ("window", "pending_kv", "pending_gate", "compress_kv", "index_k")


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str = "deepseek_v41"
    vocab_size: int = 129280
    hidden_size: int = 5120
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    head_dim: int = 512
    q_lora_rank: int = 1280
    qk_rope_head_dim: int = 64
    o_groups: int = 8
    o_lora_rank: int = 1024
    moe_intermediate_size: int = 2304
    n_routed_experts: int = 384
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    gate_temp: float = 1.0
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    rms_norm_eps: float = 1e-20
    sliding_window: int = 128
    compress_ratios: Tuple[int, ...] = ()
    kv_source_layer_ids: Tuple[int, ...] = ()
    index_source_layer_ids: Tuple[int, ...] = ()
    compress_rope_theta: float = 160000.0
    candidate_source_layer_id: int = -1
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    max_position_embeddings: int = 1048576
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    engram_layer_ids: Tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, params):
        if isinstance(params.get("text_config"), dict):  # the multimodal wrapper's text model
            params = {**params["text_config"], "model_type": params["model_type"]}
        return super().from_dict(params)

    def __post_init__(self):
        if self.engram_layer_ids:
            raise NotImplementedError(
                f"deepseek_v41: layers {list(self.engram_layer_ids)} use engram memory "
                f"(hashed n-gram embeddings), which is not supported")
        if self.scoring_func not in ("sigmoid", "softmax", "sqrtsoftplus"):
            raise ValueError(f"deepseek_v41: unknown scoring_func {self.scoring_func!r}")


def _wavelengths(args, layer):
    """RoPE wavelengths of a layer: compressed layers use ``compress_rope_theta`` with
    YaRN (attention factor 1); window-only layers the base theta, unscaled."""
    dims = args.qk_rope_head_dim
    ratios = args.compress_ratios
    if layer < len(ratios) and ratios[layer]:
        base, scaling = args.compress_rope_theta, dict(args.rope_scaling or {})
        if scaling.get("factor", 1.0) != 1.0:
            scaling.setdefault("original_max_position_embeddings", args.max_position_embeddings)
            return _yarn(dims, base, scaling, args.max_position_embeddings)[0]
    else:
        base = args.rope_theta
    return rope_wavelengths(dims, base)


def _apply_rope(x, rope, *, rope_dim, offset=0, scale=1.0, inverse=False):
    """mlx-lm's helper: ``rope`` (a module taking ``offset``, ``scale`` and ``inverse``,
    e.g. ``rope_utils.YarnRoPE``) on the last ``rope_dim`` features of ``x`` in float32,
    along axis 1 for ``(B, L, H, D)`` inputs. The model itself uses ``TailRope``."""
    if rope_dim == 0:
        return x
    tail = x[..., -rope_dim:].astype(mx.float32)
    if x.ndim == 4:
        tail = tail.transpose(0, 2, 1, 3)
    tail = rope(tail, offset=offset, scale=scale, inverse=inverse)
    if x.ndim == 4:
        tail = tail.transpose(0, 2, 1, 3)
    return mx.concatenate([x[..., :-rope_dim], tail.astype(x.dtype)], axis=-1)


def clamped_swiglu(gate, up, limit):
    """SwiGLU in float32 with ``gate`` capped at ``limit`` and ``up`` clipped to +-limit
    (no clamp when ``limit`` is 0). Bound to a limit with ``functools.partial`` so the
    modules holding it copy and pickle."""
    dtype = up.dtype
    gate, up = gate.astype(mx.float32), up.astype(mx.float32)
    if limit > 0:
        gate, up = mx.minimum(gate, limit), mx.clip(up, -limit, limit)
    return (gate * mx.sigmoid(gate) * up).astype(dtype)


class SharedExpert(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.moe_intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.moe_intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.moe_intermediate_size, args.hidden_size, bias=False)
        self.glu = partial(clamped_swiglu, limit=args.swiglu_limit)

    def __call__(self, x):
        return self.down_proj(self.glu(self.gate_proj(x), self.up_proj(x)).astype(x.dtype))


class Router(nn.Module):
    """Top-k by biased score, weighted by the unbiased score (``weight``,
    ``e_score_correction_bias``, float32)."""

    def __init__(self, args):
        super().__init__()
        self.weight = mx.zeros((args.n_routed_experts, args.hidden_size), dtype=mx.float32)
        self.e_score_correction_bias = mx.zeros((args.n_routed_experts,), dtype=mx.float32)
        self.args = args

    def __call__(self, x):
        a = self.args
        logits = (x.astype(mx.float32) @ self.weight.astype(mx.float32).T) / a.gate_temp
        if a.scoring_func == "sigmoid":
            scores = mx.sigmoid(logits)
        elif a.scoring_func == "softmax":
            scores = mx.softmax(logits, axis=-1)
        else:
            scores = mx.sqrt(nn.softplus(logits))
        k = a.num_experts_per_tok
        chosen = mx.argpartition(-(scores + self.e_score_correction_bias), k - 1, axis=-1)[..., :k]
        weights = mx.take_along_axis(scores, chosen, axis=-1)
        if a.norm_topk_prob and k > 1:
            weights = weights / (mx.sum(weights, axis=-1, keepdims=True) + 1e-20)
        return chosen, weights * a.routed_scaling_factor


class Experts(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.switch_mlp = SwitchGLU(args.hidden_size, args.moe_intermediate_size,
                                    args.n_routed_experts, glu=partial(clamped_swiglu, limit=args.swiglu_limit))


class MoE(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.gate = Router(args)
        self.experts = Experts(args)
        self.shared_experts = SharedExpert(args)

    def __call__(self, x):
        flat = x.reshape(-1, x.shape[-1])
        idx, w = self.gate(flat)
        routed = self.experts.switch_mlp(flat, idx).astype(mx.float32)
        out = mx.sum(routed * w[..., None], axis=1) + self.shared_experts(flat).astype(mx.float32)
        return out.reshape(x.shape).astype(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, args, layer):
        super().__init__()
        rope = TailRope(args.qk_rope_head_dim, _wavelengths(args, layer))
        self.self_attn = CompressedSparseAttention(args, layer, rope)
        self.mlp = MoE(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        hc = (args.hc_mult, args.hidden_size, args.hc_sinkhorn_iters, args.hc_eps,
              args.rms_norm_eps)
        self.attn_hc = HyperConnection(*hc)
        self.ffn_hc = HyperConnection(*hc)

    def __call__(self, streams, pre, start, state, shared):
        """One row; ``pre``: the collapse weights the previous layer's ``ffn_hc`` chose."""
        attn_pre, attn_post, attn_comb = self.attn_hc(streams)
        h = self.self_attn(self.input_layernorm(collapse(streams, pre)), start, state, shared)
        streams = expand(h, streams, attn_post, attn_comb)
        ffn_pre, ffn_post, ffn_comb = self.ffn_hc(streams)
        h = self.mlp(self.post_attention_layernorm(collapse(streams, attn_pre)))
        return expand(h, streams, ffn_post, ffn_comb), ffn_pre


class TextModel(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.hc = args.hc_mult

    def row(self, h, start, states):
        """Hidden states of one row's real columns ``h`` ``(1, L, D)``."""
        streams = mx.broadcast_to(h[:, :, None], (*h.shape[:2], self.hc, h.shape[-1]))
        pre = (mx.arange(self.hc) == 0).astype(mx.float32)  # the first stream only
        pre = mx.broadcast_to(pre, (*h.shape[:2], self.hc))
        shared = {}
        for layer, state in zip(self.layers, states):
            streams, pre = layer(streams, pre, start, state, shared)
        return self.norm(collapse(streams, pre))


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = TextModel(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self):
        return [RaggedStateCache(len(_STATE_KEYS)) for _ in self.layers]

    def _row_lengths(self, layer, n):
        """How many rows of each state array a row with ``n`` tokens holds at ``layer``."""
        attn = self.layers[layer].self_attn
        r = int(self.args.compress_ratios[layer]) if attn.is_kv_source else 0
        groups = n // r if r else 0
        return {"window": min(n, self.args.sliding_window),
                "pending_kv": n % r if r > 1 else 0, "pending_gate": n % r if r > 1 else 0,
                "compress_kv": groups,
                "index_k": groups if attn.is_kv_source and attn.is_index_source else 0}

    def _widths(self):
        a = self.args
        return {"window": a.head_dim, "pending_kv": a.head_dim, "pending_gate": a.head_dim,
                "compress_kv": a.head_dim, "index_k": a.index_head_dim}

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 attention=None):
        """Logits ``(B, L, vocab)``; each row runs alone on its real columns (``offset``:
        each row's position of column 0, negative over left padding)."""
        if mask is not None or input_embeddings is not None:
            raise NotImplementedError("deepseek_v41 builds its own attention per row: "
                                      "mask and input_embeddings are not supported")
        B, L = inputs.shape
        offset = resolve_offset(inputs, offset, cache)
        layers = cache if cache is not None else self.make_cache()
        # A ShiftedView (a prefill on top of cached rows) marks each row's pad columns.
        shift = getattr(layers[0], "shift", None) if cache is not None else None
        # Unwrap views to their cache (a StateCache's own ``cache`` is mlx-lm's arrays).
        layers = [c if isinstance(c, StateCache) else getattr(c, "cache", c) for c in layers]
        shift = [0] * B if shift is None else shift.tolist()
        h_all = self.model.embed_tokens(inputs)
        rows, new_states = [], []
        for b, off in enumerate(offset.tolist()):
            pad = max(shift[b], -off)
            start = off + pad
            states = [self._row_state(c, i, b, start) for i, c in enumerate(layers)]
            if pad < L:
                h = self.model.row(h_all[b:b + 1, pad:], start, states)
                h = mx.pad(h, [(0, 0), (pad, 0), (0, 0)]) if pad else h
            else:
                h = mx.zeros((1, L, self.args.hidden_size), dtype=h_all.dtype)
            rows.append(h)
            new_states.append(states)
        for i, c in enumerate(layers):
            self._store(c, [s[i] for s in new_states], h_all.dtype)
            c.advance(L)
        logits = self.lm_head(mx.concatenate(rows, axis=0))
        # Padding columns: zero logits, whatever the head's bias-free product gives.
        cols = mx.arange(L)[None] >= mx.array([max(s, -o) for s, o in
                                               zip(shift, offset.tolist())])[:, None]
        return mx.where(cols[..., None], logits, 0.0)

    def _row_state(self, c, layer, b, start):
        """Row ``b``'s state at ``layer`` as ``{key: (1, n, D) or None}``."""
        lengths = self._row_lengths(layer, start)
        out = {}
        for k, arr in zip(_STATE_KEYS, c.arrays):
            n = lengths[k]
            out[k] = arr[b:b + 1, :n] if arr is not None and n > 0 else None
        return out

    def _store(self, c, states, dtype):
        widths = self._widths()
        arrays = []
        for j, k in enumerate(_STATE_KEYS):
            found = [s[k] for s in states if s[k] is not None and s[k].shape[1] > 0]
            dt = found[0].dtype if found else (c.arrays[j].dtype if c.arrays[j] is not None
                                                else dtype)
            empty = mx.zeros((1, 0, widths[k]), dtype=dt)
            arrays.append(stack_rows([s[k] if s[k] is not None else empty for s in states]))
        c.arrays = arrays

    def sanitize(self, weights):
        """Weights in this package's (mlx-lm's) names pass through; DeepSeek's own
        names are renamed; FP8/FP4 packed weights (``.scale``) are refused."""
        if any(k.startswith("model.") for k in weights):
            return weights
        return _from_deepseek_names(weights, self.args)


# DeepSeek's checkpoint names -> this module's (HF-style) names, applied in order.
_RENAMES = (
    (".attn.", ".self_attn."), (".ffn.", ".mlp."), (".attn_norm.", ".input_layernorm."),
    (".ffn_norm.", ".post_attention_layernorm."), (".hc_attn_", ".attn_hc."),
    (".hc_ffn_", ".ffn_hc."), (".attn_sink", ".sinks"), (".wq_a.", ".q_a_proj."),
    (".wq_b.", ".q_b_proj."), (".wkv.", ".kv_proj."), (".wgate.", ".gate_proj."),
    (".wo_a.", ".o_a_proj."), (".wo_b.", ".o_b_proj."), (".q_norm.", ".q_a_norm."),
    (".compressor.norm.", ".compressor.kv_norm."), (".indexer.wk.", ".indexer.k_proj."),
    (".gate.bias", ".gate.e_score_correction_bias"),
    (".shared_experts.w1.", ".shared_experts.gate_proj."),
    (".shared_experts.w2.", ".shared_experts.down_proj."),
    (".shared_experts.w3.", ".shared_experts.up_proj."),
)
_EXPERT_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
_DROPPED = ("vision.", "aligner.", "image_", "mtp.")


def _from_deepseek_names(weights, args):
    """Rename a DeepSeek-format checkpoint; stack per-expert weights; split ``wo_a``
    into its output groups; drop the vision tower, MTP and image routing bias."""
    if any(k.endswith(".scale") for k in weights):
        raise NotImplementedError("deepseek_v41: FP8/FP4 packed weights (.scale) are not "
                                  "supported; convert to a dequantized checkpoint first")
    out, experts = {}, {}
    for key, value in weights.items():
        if key.startswith(_DROPPED) or ".engram." in key or key.endswith(".gate.bias_vl"):
            continue
        parts = key.split(".")
        if len(parts) == 7 and parts[2:4] == ["ffn", "experts"]:  # layers.i.ffn.experts.e.wN.weight
            experts.setdefault((int(parts[1]), parts[5]), {})[int(parts[4])] = value
            continue
        if key == "head.weight":
            out["lm_head.weight"] = value
            continue
        if key == "embed.weight":
            out["model.embed_tokens.weight"] = value
            continue
        name = f"model.{key}"
        for old, new in _RENAMES:
            name = name.replace(old, new)
        if name.endswith(".o_a_proj.weight"):  # block diagonal: one matrix per group
            value = value.reshape(args.o_groups, -1, value.shape[-1])
        out[name] = value
    for (layer, proj), rows in experts.items():
        if len(rows) != args.n_routed_experts:
            raise ValueError(f"deepseek_v41: layer {layer} has {len(rows)} {proj} expert "
                             f"weights, the config declares {args.n_routed_experts}")
        out[f"model.layers.{layer}.mlp.experts.switch_mlp.{_EXPERT_PROJ[proj]}.weight"] = \
            mx.stack([rows[e] for e in sorted(rows)])
    return out
