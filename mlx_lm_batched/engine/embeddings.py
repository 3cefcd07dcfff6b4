"""Embeddings: the decoder stack's last hidden states (after its final norm) over a
left-padded batch, pooled per row.

Rows are left-padded and their positions start at 0 (``offset`` is minus the padding),
so the one mask path hides the padding and every row equals the sequence run alone.
"""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import numpy as np

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..layers.stack import CausalLM, DecoderStack
from ..layers.step import resolve_masks

POOLINGS = ("mean", "last", "cls", "max")


@dataclass(frozen=True)
class Pooling:
    """How a row of hidden states becomes one vector: ``mode`` (``"mean"`` over the real
    tokens, ``"last"`` token, ``"cls"``: the first token, ``"max"`` per dimension),
    ``normalize`` (unit length), ``dimensions`` (keep the first ``dimensions`` values
    before normalizing, as Matryoshka models are read; None: all)."""

    mode: str = "mean"
    normalize: bool = True
    dimensions: Optional[int] = None


def embedding_support(model):
    """None when ``model`` can embed text, else a sentence saying why not (a model
    whose layers keep recurrent state, or that is not a plain decoder stack)."""
    if not isinstance(model, CausalLM) or not isinstance(getattr(model, "model", None), DecoderStack):
        return f"{type(model).__module__.rsplit('.', 1)[-1]} is not a plain decoder stack"
    try:
        caches = model.make_cache()
    except Exception as e:  # a model that cannot say its cache kinds
        return f"its cache layout is unknown ({e})"
    if not all(type(c) in (KVCache, RotatingKVCache) for c in caches):
        return "its layers keep recurrent state"
    return None


def hidden_states(model, prompts):
    """``(B, L, hidden)`` last hidden states of token lists ``prompts``, left-padded to
    the longest, and the padding of each row."""
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    inputs = mx.array([[0] * pad + list(p) for p, pad in zip(prompts, pads)], dtype=mx.int32)
    offset = mx.array([-pad for pad in pads], dtype=mx.int32)
    masks = resolve_masks(None, None, model.layer_windows, width, offset,
                          model.get("layer_chunks"), model.get("layer_block_sparse"))
    return model.model(inputs, masks, offset, None), pads


def pool(h, pad, pooling: Pooling):
    """One row's vector (float32 numpy) from its hidden states ``h`` ``(L, hidden)``
    whose first ``pad`` columns are padding."""
    real = h[pad:].astype(mx.float32)
    if pooling.mode == "mean":
        v = real.mean(axis=0)
    elif pooling.mode == "last":
        v = real[-1]
    elif pooling.mode == "cls":
        v = real[0]
    else:
        v = real.max(axis=0)
    if pooling.dimensions is not None:
        v = v[: pooling.dimensions]
    if pooling.normalize:
        v = v / mx.maximum(mx.sqrt((v * v).sum()), 1e-12)
    return np.array(v, dtype=np.float32)


def embed(model, prompts, pooling: Pooling, max_rows=16, max_tokens=8192):
    """Vectors of token lists ``prompts`` (float32 numpy rows, in order). Rows run in
    batches of at most ``max_rows`` rows and ``max_tokens`` padded tokens, shortest
    first (less padding; a row's vector does not depend on its batch)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [None] * len(prompts)
    batch = []
    for i in order + [None]:
        wide = i is not None and (len(batch) + 1) * len(prompts[i]) > max_tokens
        if batch and (i is None or len(batch) == max_rows or wide):
            h, pads = hidden_states(model, [prompts[j] for j in batch])
            mx.eval(h)
            for row, (j, pad) in enumerate(zip(batch, pads)):
                out[j] = pool(h[row], pad, pooling)
            batch = []
        if i is not None:
            batch.append(i)
    return out
