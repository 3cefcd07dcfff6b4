"""Pipeline parallelism by layer ranges over an ``mx.distributed`` group.

:func:`pipeline_model` turns a loaded model (weights may still be lazy) into stage ``r``
of ``group.size()`` stages, ``r = group.rank()``: the stage keeps only the blocks
``[a_r, b_r)`` (stage 0 also the embedding, the last stage the final norm and the LM
head), so only those weights are ever materialised. In each forward pass the hidden
states flow from stage to stage with ``mx.distributed.send``/``recv``; the last stage
computes the logits and every rank ends with them (an ``all_sum`` where the other stages
contribute zeros: ``x + 0 == x``, so the logits are exactly the last stage's), so the
batch driver runs unchanged and identically on every rank (sampling agrees when the
ranks share a seed, see ``distributed.shared_seed``).

Decode steps are split into micro-batches of rows: each stage queues the send of
micro-batch ``i`` (``mx.async_eval``) before it builds ``i + 1``, so stage 0 computes
``i + 1`` while stage 1 computes ``i``. Works for every model built from the shared
``DecoderStack``/``CausalLM`` (no per-architecture code); each rank's caches hold only
its own layers.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.sinks import capture_sinks
from ..layers.stack import CausalLM, DecoderStack
from .tensor import split_range

SPLITS = ("layers", "bytes")
# Architectures whose layers share state across layers (a later layer reading an
# earlier one's KV cache) cannot be cut between those layers; none is built here yet,
# mlx-lm's names are listed so that a future port is refused until it is handled.
SHARED_STATE = {"gemma3n", "hunyuan_v1_cla"}


@dataclass
class Stage:
    """What one rank of a pipeline knows: its layers ``[start, stop)`` of ``n_layers``,
    the hidden size and dtypes at its boundaries, the vocabulary and logits dtype."""

    group: Any
    rank: int
    size: int
    start: int
    stop: int
    n_layers: int
    hidden: int
    in_dtype: Any  # hidden states received (stage > 0)
    out_dtype: Any  # hidden states sent (stage < last)
    logits_dtype: Any
    vocab: int
    micro_batches: int

    @property
    def first(self):
        return self.rank == 0

    @property
    def last(self):
        return self.rank == self.size - 1


def layer_ranges(sizes, parts, first_extra=0, last_extra=0):
    """Contiguous ``[start, stop)`` layer ranges, one per part, each at least one layer,
    balancing ``sum(sizes)`` per part; ``first_extra``/``last_extra`` count towards the
    first and last part (the embedding, the final norm and head)."""
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} layers into {parts} pipeline stages: at most {n}")
    cum = [first_extra]
    for s in sizes:
        cum.append(cum[-1] + s)
    total = cum[-1] + last_extra
    bounds = [0]
    for k in range(1, parts):
        target = total * k / parts
        lo, hi = bounds[-1] + 1, n - (parts - k)
        bounds.append(min(range(lo, hi + 1), key=lambda j: (abs(cum[j] - target), j)))
    bounds.append(n)
    return list(zip(bounds[:-1], bounds[1:]))


def _nbytes(module):
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def _promote(dtype, modules):
    """``dtype`` promoted with every floating parameter of ``modules`` (read from the
    arrays' metadata: nothing is evaluated)."""
    for m in modules:
        for _, v in tree_flatten(m.parameters()):
            if mx.issubdtype(v.dtype, mx.floating) and v.dtype != dtype:
                dtype = (mx.zeros((), dtype) + mx.zeros((), v.dtype)).dtype
    return dtype


class ZeroHead(nn.Module):
    """The LM head of a stage that is not the last: zeros, summed with the last stage's
    logits over the group."""

    def __init__(self, vocab, dtype):
        super().__init__()
        self.vocab, self.dtype = vocab, dtype

    def __call__(self, h):
        return mx.zeros((*h.shape[:-1], self.vocab), self.dtype)


class _DecodeRows:
    """Rows ``[start, stop)`` of a ``KVCache``/``RotatingKVCache`` for one decode step of
    a micro-batch: writes the rows' key/value at the step's slot and returns their
    cached slots, as ``update_and_fetch`` does for one token. The slot count advances
    once, after every micro-batch wrote (``_commit``)."""

    def __init__(self, parent, start, stop, batch):
        self.parent, self.start, self.stop, self.batch = parent, start, stop, batch

    @property
    def wants_offset(self):
        """As the parent's: a ring that keeps sink tokens finds each row's by position."""
        return getattr(self.parent, "wants_offset", False)

    def update_and_fetch(self, keys, values, offset=None):
        p, S = self.parent, self.parent.size
        wrapped = isinstance(p, RotatingKVCache) and S >= p.max_size
        slot, held = (S % p.max_size, p.max_size) if wrapped else (S, S + 1)
        if not wrapped:
            p.unblock()  # micro-batches write one rectangle (no-op for rings)
            p.allocate(S + 1, keys, values, batch=self.batch)
        rows = slice(self.start, self.stop)
        p.keys[rows, :, slot:slot + 1, :] = keys
        p.values[rows, :, slot:slot + 1, :] = values
        out = p.keys[rows, :, :held, :], p.values[rows, :, :held, :]
        if not getattr(p, "keep", 0):
            return out
        # Sinks (RotatingKVCache(keep)): a row still within its first ``keep`` tokens
        # writes this one in; the keys returned are the sinks, then the ring's.
        if p.sink_keys is None or offset is None:
            raise ValueError("a micro-batched decode step on a ring with sinks needs the "
                             "prefilled sinks and the rows' offset")
        sink_k = capture_sinks(p.sink_keys[rows], keys, offset, p.keep)
        sink_v = capture_sinks(p.sink_values[rows], values, offset, p.keep)
        p.sink_keys[rows], p.sink_values[rows] = sink_k, sink_v
        return (mx.concatenate([sink_k, out[0]], axis=2),
                mx.concatenate([sink_v, out[1]], axis=2))


def _commit(caches):
    for c in caches:
        c.size += 1


def _rows_mask(mask, a, b, batch):
    if isinstance(mask, mx.array) and mask.ndim == 4 and mask.shape[0] == batch:
        return mask[a:b]
    return mask


def _rows_attention(attention, a, b):
    groups = getattr(attention, "row_groups", None)
    if not groups:
        return attention
    mine = [(max(s, a) - a, min(e, b) - a, f) for s, e, f in groups if s < b and e > a]
    return dataclasses.replace(attention, row_groups=mine if len(mine) > 1 else None)


class PipelineStack(DecoderStack):
    """A ``DecoderStack`` holding one stage's blocks (``stage``, a :class:`Stage`)."""

    stage: Optional[Stage] = None

    def _parts(self, B, L, cache):
        """Row ranges of the micro-batches: several only for decode steps (one token per
        row) on plain key/value caches, whose one-slot writes ``_DecodeRows`` splits."""
        m = min(self.stage.micro_batches, B)
        if L != 1 or m < 2 or any(type(c) not in (KVCache, RotatingKVCache) for c in cache):
            return [(0, B)]
        return [split_range(B, m, i) for i in range(m)]

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        s = self.stage
        B, L = inputs.shape[:2]
        cache = cache if cache is not None else [None] * len(self.layers)
        parts = self._parts(B, L, cache)
        split = len(parts) > 1
        if not s.first:
            # The ranks must run their collectives in one order. Stage 0 cannot send
            # before it has these tokens, which may come from the previous call's
            # logits (an all_sum): queue them first here too, before the receives.
            mx.async_eval(inputs)
        outs = []
        for a, b in parts:
            if s.first:
                emb = None if input_embeddings is None else input_embeddings[a:b]
                h = self.embed(inputs[a:b], offset[a:b], emb)
            else:
                h = mx.distributed.recv((b - a, L, s.hidden), s.in_dtype, s.rank - 1, group=s.group)
            caches = [_DecodeRows(c, a, b, B) for c in cache] if split else cache
            rows_masks = [_rows_mask(m, a, b, B) for m in masks] if split else masks
            extra = () if attention is None else (_rows_attention(attention, a, b) if split
                                                  else attention,)
            for layer, m, c in zip(self.layers, rows_masks, caches):
                h = layer(h, m, offset[a:b], c, *extra)
            if not s.last:
                # Queued now, whatever the caller evaluates later (a prefill chunk only
                # evaluates the caches): the next stage is waiting for it.
                h = mx.distributed.send(h.astype(s.out_dtype), s.rank + 1, group=s.group)
                mx.async_eval(h)
            elif split:
                mx.async_eval(h)  # receive the micro-batches in the order they were sent
            outs.append(h)
        if split:
            _commit(cache)
        h = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)
        return self.norm(h) if s.last else h


class PipelineLM:
    """Mixed into a pipelined model's class: ends every forward pass with the last
    stage's logits on every rank, and builds caches for this stage's layers only."""

    stage: Optional[Stage] = None

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 attention=None):
        kwargs = {k: v for k, v in (("input_embeddings", input_embeddings),
                                    ("attention", attention)) if v is not None}
        out = super().__call__(inputs, mask=mask, offset=offset, cache=cache, **kwargs)
        return mx.distributed.all_sum(out.astype(self.stage.logits_dtype), group=self.stage.group)

    def probe_caches(self, cache):
        """Run this stage's own layers on one zero token into ``cache``, lazily and
        without sending anything (``kv_budget`` reads the caches' layouts from it; the
        forward pass would queue sends the other stages never receive)."""
        from ..layers.step import resolve_masks

        s = self.stage
        h = mx.zeros((1, 1, s.hidden), s.in_dtype)
        offset = mx.zeros((1,), mx.int32)
        masks = resolve_masks(None, cache, self.layer_windows, 1, offset, self.get("layer_chunks"),
                              self.get("layer_block_sparse"))
        for layer, m, c in zip(self.model.layers, masks, cache):
            h = layer(h, m, offset, c)

    def make_cache(self, max_kv_size=None):
        caches = super().make_cache(max_kv_size=max_kv_size)
        s = self.stage
        if len(caches) == s.n_layers:  # an override that builds caches from the config
            caches = caches[s.start:s.stop]
        if len(caches) != s.stop - s.start:
            raise ValueError(f"{type(self).__name__}.make_cache gave {len(caches)} caches for "
                             f"{s.stop - s.start} layers")
        return caches


_CLASSES = {}


def _pipelined_class(cls):
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Pipelined{cls.__name__}", (PipelineLM, cls), {})
    return _CLASSES[cls]


def stage_ranges(model, parts, split="layers"):
    """Layer ranges of ``parts`` stages of ``model`` (see :func:`layer_ranges`):
    ``split="layers"`` balances the number of blocks, ``"bytes"`` their parameter bytes
    with the embedding on the first stage and the final norm and head on the last."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    layers = model.model.layers
    if split == "layers":
        return layer_ranges([1] * len(layers), parts)
    stack = model.model
    head = model.lm_head if "lm_head" in model else stack.embed_tokens
    first = _nbytes(stack.embed_tokens) + (_nbytes(stack.embed_positions)
                                           if "embed_positions" in stack else 0)
    return layer_ranges([_nbytes(m) for m in layers], parts, first,
                        _nbytes(stack.norm) + _nbytes(head))


def _check(model):
    if not isinstance(model, CausalLM) or type(model.model) is not DecoderStack:
        raise TypeError(f"pipeline parallelism needs a model built from the shared CausalLM "
                        f"and DecoderStack; {type(model).__module__}.{type(model).__name__} is not")
    name = getattr(model, "model_type", None) or getattr(getattr(model, "args", None),
                                                           "model_type", None)
    caches = model.make_cache()
    if name in SHARED_STATE or len(caches) != len(model.model.layers):
        raise ValueError(f"cannot pipeline model_type {name!r}: its layers share state across "
                         "layers")


def pipeline_model(model, group=None, split="layers", micro_batches=None):
    """Make ``model`` stage ``group.rank()`` of a pipeline over ``group`` (default:
    ``mx.distributed.init()``), in place; returns ``model``.

    Call it before the weights are evaluated (``load(..., lazy=True)``): the blocks of
    other stages, and the embedding, norm and head where this stage needs none, are
    dropped unevaluated. ``split``: ``"layers"`` (same number of blocks per stage) or
    ``"bytes"`` (same parameter bytes). ``micro_batches``: row groups per decode step
    (default: one per stage). A group of one rank leaves the model unchanged. Raises
    ``TypeError`` for a model not built from ``CausalLM``/``DecoderStack`` and
    ``ValueError`` when it has fewer blocks than stages or shares state across layers.
    """
    group = group or mx.distributed.init()
    size, rank = group.size(), group.rank()
    if size == 1:
        return model
    if micro_batches is not None and (not isinstance(micro_batches, int) or micro_batches < 1):
        raise ValueError(f"micro_batches must be an integer >= 1, got {micro_batches!r}")
    _check(model)
    stack = model.model
    layers, tied = stack.layers, "lm_head" not in model
    start, stop = stage_ranges(model, size, split)[rank]
    # Lazy probes: shapes and dtypes are known without evaluating anything.
    probe = stack.embed(mx.zeros((1, 1), mx.int32), mx.zeros((1,), mx.int32))
    head = stack.embed_tokens if tied else model.lm_head
    out_dtype = _promote(probe.dtype, layers[:stop])
    final = _promote(_promote(probe.dtype, layers), [stack.norm])
    logits = (head.as_linear if tied else head)(mx.zeros((1, 1, probe.shape[-1]), final))
    stage = Stage(group, rank, size, start, stop, len(layers), probe.shape[-1],
                  _promote(probe.dtype, layers[:start]), out_dtype, logits.dtype,
                  logits.shape[-1], micro_batches or size)
    stack.layers = layers[start:stop]
    model.layer_windows = list(model.layer_windows)[start:stop]
    if model.get("layer_chunks") is not None:  # Llama 4's chunked layers
        model.layer_chunks = list(model.layer_chunks)[start:stop]
    if not stage.first:
        stack.pop("embed_positions", None)
        if not (stage.last and tied):
            stack.pop("embed_tokens")
    if not stage.last:
        stack.pop("norm")
        model.lm_head = ZeroHead(stage.vocab, stage.logits_dtype)
    stack.__class__ = PipelineStack
    stack.stage = model.stage = stage
    model.__class__ = _pipelined_class(type(model))
    return model
