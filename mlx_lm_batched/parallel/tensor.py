"""Tensor parallelism of the shared layers over an ``mx.distributed`` group.

``shard.shard_model`` shards a loaded model in place, driven by the layer classes
(``Attention``, ``MLP``, ``DenseMLP``, ``SwitchGLU``/``SwitchMLP`` experts,
``MultiHeadLatentAttention``), never by ``model_type``: each block's input projections
keep this rank's output rows (all-to-sharded) and its output projection keeps the matching
input columns and sums its result over the group (sharded-to-all), one all-reduce per
attention and per MLP block. Embeddings, norms, routers and the LM head stay replicated.

Head counts that do not divide by the group size still shard exactly: whole KV groups are
split unevenly (rank r gets KV heads ``[a_r, b_r)`` and their query heads); with fewer KV
heads than ranks a KV head is replicated and its query heads split. Each rank's KV cache
then holds only its own heads. Quantized layers are split in whole quantization groups.
"""

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention, OutputGatedAttention
from ..layers.mla import MultiHeadLatentAttention
from ..layers.mlp import MLP, DenseMLP
from ..layers.moe import QuantizedSwitchLinear, SwitchGLU, SwitchLinear, SwitchMLP
from ..layers.norms import HeadwiseLayerNorm, RMSNorm
from .sharded_layers import SHARDED_TO_ALL, ShardedRMSNorm

LINEARS = (nn.Linear, nn.QuantizedLinear, SwitchLinear, QuantizedSwitchLinear)
# Linear layers outside the known blocks that every rank keeps whole: the LM head and
# MoE routers (small, and every rank needs their full output).
REPLICATED = {"lm_head", "gate", "router", "layer", "shared_expert_gate",
              "coefficient",  # Klear's routed/shared mixing weights
              # Kimi K3's attention-residual logits (one per token)
              "self_attention_res_proj", "mlp_res_proj", "output_attn_res_proj"}


def split_range(n, parts, i, unit=1):
    """``[start, stop)`` of part ``i`` when ``n`` items (in blocks of ``unit``) are cut
    into ``parts`` contiguous pieces whose sizes differ by at most one block."""
    blocks = n // unit
    base, rem = divmod(blocks, parts)
    start = i * base + min(i, rem)
    return start * unit, (start + base + (i < rem)) * unit


def head_ranges(n_heads, n_kv_heads, size, rank):
    """This rank's query heads ``(qa, qb)`` and KV heads ``(ka, kb)``.

    With at least as many KV heads as ranks, whole KV groups are split (unevenly when
    they do not divide); with fewer, the ranks are spread over the KV heads, each KV head
    replicated on its ranks and its query heads split between them.
    """
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    group = n_heads // n_kv_heads
    if n_kv_heads >= size:
        ka, kb = split_range(n_kv_heads, size, rank)
        return (ka * group, kb * group), (ka, kb)
    kv = rank * n_kv_heads // size
    members = [r for r in range(size) if r * n_kv_heads // size == kv]
    if group < len(members):
        raise ValueError(f"cannot shard {n_heads} query heads ({n_kv_heads} KV heads) over "
                         f"{size} ranks: at most {n_heads} ranks")
    a, b = split_range(group, len(members), members.index(rank))
    return (kv * group + a, kv * group + b), (kv, kv + 1)


def _quant_unit(layer):
    return layer.group_size if isinstance(layer, (nn.QuantizedLinear, QuantizedSwitchLinear)) else 1


def _slice_out(layer, ranges):
    """Keep output rows ``ranges`` (a list of ``(start, stop)``) of a linear layer."""
    axis = 1 if isinstance(layer, (SwitchLinear, QuantizedSwitchLinear)) else 0
    for name in ("weight", "scales", "biases", "bias"):
        w = layer.get(name)
        if w is None:
            continue
        idx = [slice(None)] * axis
        layer[name] = mx.concatenate([w[tuple(idx + [slice(a, b)])] for a, b in ranges], axis=axis)


def _slice_in(layer, a, b, group, path):
    """Keep input columns ``[a, b)`` and make the layer sum its output over ``group``."""
    unit = _quant_unit(layer)
    if a % unit or b % unit:
        raise ValueError(f"cannot shard '{path}': input columns [{a}, {b}) are not whole "
                         f"quantization groups of {unit}")
    if unit > 1:
        if (a * layer.bits) % 32:
            raise ValueError(f"cannot shard '{path}': column {a} is not a whole packed word")
        layer["weight"] = layer["weight"][..., a * layer.bits // 32:b * layer.bits // 32]
        layer["scales"] = layer["scales"][..., a // unit:b // unit]
        if layer.get("biases") is not None:
            layer["biases"] = layer["biases"][..., a // unit:b // unit]
    else:
        layer["weight"] = layer["weight"][..., a:b]
    layer.__class__ = SHARDED_TO_ALL[type(layer)]
    layer.group = group


def _shard_attention(attn, group, path):
    size, rank = group.size(), group.rank()
    (qa, qb), (ka, kb) = head_ranges(attn.n_heads, attn.n_kv_heads, size, rank)
    hd, nq, nk = attn.head_dim, attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim
    q, k = [(qa * hd, qb * hd)], [(ka * hd, kb * hd)]
    if attn.fused_qkv:
        _slice_out(getattr(attn, attn.qkv_name), q + [(nq + ka * hd, nq + kb * hd),
                                       (nq + nk + ka * hd, nq + nk + kb * hd)])
    else:
        _slice_out(attn.q_proj, q)
        # No k/v projections here: KV-shared (SharedKVAttention) or cross-layer (Hunyuan)
        # attention attends another layer's keys/values, sharded the same way.
        if "k_proj" in attn:
            _slice_out(attn.k_proj, k)
        if "v_proj" in attn:  # else the values are the keys (Gemma 4) or another layer's
            vd = getattr(attn, "v_head_dim", hd)  # narrower value heads (MiMo-V2-Flash)
            _slice_out(attn.v_proj, [(ka * vd, kb * vd)])
    if isinstance(attn, OutputGatedAttention):  # a gate per query head or feature
        _slice_out(getattr(attn, attn.gate_name), [(qa, qb)] if attn.per_head else q)
    vd = getattr(attn, "v_head_dim", hd)
    _slice_in(attn.o_proj, qa * vd, qb * vd, group, f"{path}.o_proj")
    if attn.has_qk_norm:
        for name, (a, b) in zip(attn.qk_norm_names, ((qa, qb), (ka, kb))):
            if name not in attn:  # no key norm where the keys are another layer's
                continue
            _shard_qk_norm(getattr(attn, name), a, b, hd, attn.qk_norm_full, group, f"{path}.{name}")
    if "sinks" in attn:
        attn.sinks = attn.sinks[qa:qb]
    attn.n_heads, attn.n_kv_heads = qb - qa, kb - ka


def _shard_qk_norm(norm, a, b, hd, full, group, path):
    """Per-head norms are untouched; norms over the whole projection get this rank's heads."""
    if isinstance(norm, HeadwiseLayerNorm):
        norm.weight = norm.weight[a:b]
        if "bias" in norm:
            norm.bias = norm.bias[a:b]
    elif full and type(norm) is RMSNorm:
        full_dims = norm.weight.shape[0]
        norm.weight = norm.weight[a * hd:b * hd]
        norm.__class__ = ShardedRMSNorm
        norm.group, norm.full_dims = group, full_dims
    elif full:
        raise ValueError(f"cannot shard '{path}' ({type(norm).__name__}): a norm over the "
                         "whole projection of an unknown kind")


def _shard_mlp(up_names, down, group, path):
    """Split the hidden units of ``up_names`` (output rows) and ``down`` (input columns);
    ``up_names`` maps each input projection to the number of hidden blocks it holds
    (2 for a fused gate+up)."""
    size, rank = group.size(), group.rank()
    hidden = down.weight.shape[-1]
    if _quant_unit(down) > 1:
        hidden = hidden * 32 // down.bits
    a, b = split_range(hidden, size, rank, _quant_unit(down))
    if a == b:
        raise ValueError(f"cannot shard '{path}': {hidden} hidden units over {size} ranks")
    for layer, parts in up_names:
        _slice_out(layer, [(p * hidden + a, p * hidden + b) for p in range(parts)])
    _slice_in(down, a, b, group, f"{path}.down")


def _shard_mla(attn, group, path):
    size, rank = group.size(), group.rank()
    if attn.n_heads < size:
        raise ValueError(f"cannot shard '{path}': {attn.n_heads} heads over {size} ranks")
    a, b = split_range(attn.n_heads, size, rank)
    qk = attn.qk_nope_head_dim + attn.qk_rope_head_dim
    kv = attn.qk_nope_head_dim + attn.v_head_dim
    _slice_out(attn.q_proj if attn.q_lora_rank is None else attn.q_b_proj, [(a * qk, b * qk)])
    _slice_out(attn.kv_b_proj, [(a * kv, b * kv)])
    if "g_proj" in attn:  # output gates per head: one, or one per value feature
        w = attn.gate_width
        _slice_out(attn.g_proj, [(a * w, b * w)])
    _slice_in(attn.o_proj, a * attn.v_head_dim, b * attn.v_head_dim, group, f"{path}.o_proj")
    attn.n_heads = b - a


def shard_shared_block(module, group, path):
    """Shard ``module`` when it is one of the shared blocks; return False for others."""
    if isinstance(module, Attention):
        _shard_attention(module, group, path)
    elif isinstance(module, MultiHeadLatentAttention):
        _shard_mla(module, group, path)
    elif isinstance(module, MLP):
        ups = [(module.gate_up_proj, 2)] if module.fused_gate_up else [(module.gate_proj, 1),
                                                                          (module.up_proj, 1)]
        _shard_mlp(ups, module.down_proj, group, path)
    elif isinstance(module, DenseMLP):
        up, down = (getattr(module, n) for n in module.names)
        _shard_mlp([(up, 1)], down, group, path)
    elif isinstance(module, SwitchGLU):
        _shard_mlp([(module.gate_proj, 1), (module.up_proj, 1)], module.down_proj, group, path)
    elif isinstance(module, SwitchMLP):
        _shard_mlp([(module.fc1, 1)], module.fc2, group, path)
    else:
        return False
    return True
