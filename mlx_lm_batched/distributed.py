"""Tensor parallelism of the shared layers over an ``mx.distributed`` group.

:func:`shard_model` shards a loaded model in place, driven by the layer classes
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

import os
import sys
import threading
import time

import mlx.core as mx
import mlx.nn as nn

from .models.layers import MLP, Attention, DenseMLP, HeadwiseLayerNorm, RMSNorm
from .models.mla import MultiHeadLatentAttention
from .models.moe import QuantizedSwitchLinear, SwitchGLU, SwitchLinear, SwitchMLP
from .models.sharded_layers import SHARDED_TO_ALL, ShardedRMSNorm

LINEARS = (nn.Linear, nn.QuantizedLinear, SwitchLinear, QuantizedSwitchLinear)
# Linear layers outside the known blocks that every rank keeps whole: the LM head and
# MoE routers (small, and every rank needs their full output).
REPLICATED = {"lm_head", "gate", "router", "layer", "shared_expert_gate"}


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
        _slice_out(attn.qkv_proj, q + [(nq + ka * hd, nq + kb * hd),
                                       (nq + nk + ka * hd, nq + nk + kb * hd)])
    else:
        _slice_out(attn.q_proj, q)
        # No k/v projections here: KV-shared (SharedKVAttention) or cross-layer (Hunyuan)
        # attention attends another layer's keys/values, sharded the same way.
        if "k_proj" in attn:
            _slice_out(attn.k_proj, k)
        if "v_proj" in attn:  # else the values are the keys (Gemma 4) or another layer's
            _slice_out(attn.v_proj, k)
    _slice_in(attn.o_proj, qa * hd, qb * hd, group, f"{path}.o_proj")
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
    _slice_in(attn.o_proj, a * attn.v_head_dim, b * attn.v_head_dim, group, f"{path}.o_proj")
    attn.n_heads = b - a


def _shard_block(module, group, path):
    """Shard ``module`` when it is a known block; return False for other modules."""
    shard = getattr(type(module), "shard", None)
    if shard is not None:  # a layer that shards itself (recurrent mixers: sharded_recurrent.py)
        shard(module, group, path)
    elif isinstance(module, Attention):
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


def _walk(module, group, path, parent):
    if isinstance(module, LINEARS):
        # A router's own projection (Bailing's ``gate.gate_proj``) is replicated too.
        if not REPLICATED & set(path.split(".")[-2:]):
            raise ValueError(f"cannot shard layer '{path}' of {type(parent).__name__}: the sharder "
                             "knows Attention, MLP, DenseMLP, SwitchGLU, SwitchMLP and "
                             "MultiHeadLatentAttention blocks")
        return
    if _shard_block(module, group, path):
        return
    for name, child in module.children().items():
        items = child if isinstance(child, list) else [child]
        for i, c in enumerate(items):
            if isinstance(c, nn.Module):
                sub = f"{path}.{name}.{i}" if isinstance(child, list) else f"{path}.{name}"
                _walk(c, group, sub.lstrip("."), module)


def shard_model(model, group=None):
    """Tensor-parallel ``model`` in place over ``group`` (default: ``mx.distributed.init()``).

    Weights may still be lazy (unevaluated): only each rank's slices are materialised when
    the caller evaluates the parameters. A group of size 1 leaves the model unchanged.
    Raises ``ValueError`` naming the first layer the sharder does not know, or one whose
    heads or quantization groups cannot be split over the group. Returns ``model``.
    """
    group = group or mx.distributed.init()
    if group.size() > 1:
        _walk(model, group, "", None)
    return model


MODES = ("auto", "tensor", "pipeline", "off")
# Seconds the CLI may go without a generated token before the watchdog decides a peer is
# gone (a long prefill chunk counts too); MLX_LM_BATCHED_DIST_TIMEOUT overrides it.
STEP_TIMEOUT = float(os.environ.get("MLX_LM_BATCHED_DIST_TIMEOUT", "") or 300.0)


def group_for(mode="auto"):
    """The group to shard over for ``mode`` (the CLI's ``--distributed``), or None.

    ``auto``: the group of ``mx.distributed.init()`` when it has more than one rank (as
    under ``mlx.launch``; sharded as ``tensor``); ``tensor`` and ``pipeline``: that group,
    required; ``off``: None.
    """
    if mode not in MODES:
        raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return None
    group = mx.distributed.init()
    if group.size() > 1:
        return group
    if mode in ("tensor", "pipeline"):
        raise ValueError(f"{mode} parallelism needs more than one rank: start the command "
                         "with `mlx.launch -n 2 --backend ring -- ...`")
    return None


def finish_sharding(model, group, mode="tensor"):
    """Shard ``model`` (weights may be lazy) over ``group`` — heads and columns for
    ``mode="tensor"`` (or ``"auto"``), layer ranges for ``"pipeline"`` — materialise this
    rank's part and wait until every rank has; returns ``model``."""
    if mode == "pipeline":
        from .pipeline import pipeline_model  # pipeline imports this module

        pipeline_model(model, group)
    else:
        shard_model(model, group)
    mx.eval(model.parameters())
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu, group=group))
    return model


def shared_seed(group, seed=None):
    """``seed``, or rank 0's random seed, identical on every rank (sampling must agree)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") >> 1 if group.rank() == 0 else 0
        seed = mx.distributed.all_sum(mx.array(seed if group.rank() == 0 else 0, mx.int32),
                                      stream=mx.cpu, group=group).item()
    return seed


class guard_collectives:
    """Context manager that turns a lost or stalled peer into a clear exit, not a hang.

    A peer that dies makes MLX's collectives raise ``RuntimeError``; inside the block that
    becomes ``SystemExit`` with one line naming this rank. A peer that stalls is caught by
    a watchdog thread: when ``timeout`` seconds pass without :meth:`tick` (call it once
    per step), the process prints the error and exits with status 1.
    """

    def __init__(self, timeout=120.0, group=None):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self.rank = (group or mx.distributed.init()).rank()
        self._deadline = None
        self._done = threading.Event()

    def tick(self):
        """Progress was made: restart the watchdog's clock."""
        self._deadline = time.monotonic() + self.timeout

    def _watch(self):
        while not self._done.wait(0.5):
            if time.monotonic() > self._deadline:
                print(f"[rank {self.rank}] error: no progress from the distributed group for "
                      f"{self.timeout:g} s (a peer stalled or died); exiting", file=sys.stderr,
                      flush=True)
                os._exit(1)

    def __enter__(self):
        self.tick()
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._done.set()
        if exc_type is RuntimeError and ("[ring]" in str(exc) or "peer" in str(exc)):
            raise SystemExit(f"[rank {self.rank}] error: lost a peer of the distributed "
                             f"group ({exc})") from exc
        return False


def sharded_load(repo, pipeline_group=None, tensor_group=None, return_config=False, *,
                 tokenizer_config=None, trust_remote_code=False):
    """Load a model sharded over ``mx.distributed`` groups (mlx-lm's ``sharded_load``).

    ``tensor_group`` splits attention heads and MLP/expert columns over its ranks (see
    :mod:`mlx_lm_batched.distributed`); ``pipeline_group`` splits the layers into one
    contiguous range per rank (see :mod:`mlx_lm_batched.pipeline`); with neither given,
    tensor parallelism over ``mx.distributed.init()``. The weights are read lazily and
    cut before they are evaluated, so each rank materialises only its part. Both groups
    with more than one rank each raise ``ValueError`` (not supported: MLX's ring backend
    cannot split a group, so the combination could not be tested).
    Returns ``(model, tokenizer)``, plus the config when ``return_config``.
    """
    from .utils import load  # utils resolves its sharded_load here

    pipeline = pipeline_group is not None and pipeline_group.size() > 1
    if pipeline and tensor_group is not None and tensor_group.size() > 1:
        raise ValueError("sharded_load: pipeline_group and tensor_group cannot both have more "
                         "than one rank; pass one of them")
    if pipeline_group is None and tensor_group is None:
        tensor_group = mx.distributed.init()
    model, tokenizer, config = load(repo, tokenizer_config=tokenizer_config, lazy=True,
                                    return_config=True, trust_remote_code=trust_remote_code)
    if pipeline:
        finish_sharding(model, pipeline_group, "pipeline")
    elif tensor_group is not None:
        finish_sharding(model, tensor_group)
    else:  # a pipeline group of one rank: the whole model here
        mx.eval(model.parameters())
    return (model, tokenizer, config) if return_config else (model, tokenizer)
