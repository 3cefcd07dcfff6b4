"""Embeddings: the decoder stack's last hidden states (after its final norm), pooled.

Each text runs as a row of its own, so its vector is the same bits as the text embedded
alone whatever else is embedded with it (see :func:`embed`).
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


def hidden_states(model, prompt, chunk=2048):
    """``(L, hidden)`` last hidden states of the token list ``prompt`` run as one row of
    its own (lazy). A prompt longer than ``chunk`` goes in chunks of ``chunk`` columns
    through the model's caches, as a prefill does, so a long text's activations stay
    bounded; how a prompt is cut depends on its length alone."""
    caches = model.make_cache() if len(prompt) > chunk else None
    windows = model.layer_windows
    parts = []
    for start in range(0, len(prompt), chunk):
        ids = mx.array([prompt[start:start + chunk]], dtype=mx.int32)
        offset = mx.array([start], dtype=mx.int32)
        masks = resolve_masks(None, caches, windows, ids.shape[1], offset,
                              model.get("layer_chunks"), model.get("layer_block_sparse"))
        parts.append(model.model(ids, masks, offset, caches)[0])
        if caches is not None:
            mx.eval(parts[-1])  # one chunk at a time: its activations go before the next
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)


def pool(h, pooling: Pooling):
    """One row's vector (lazy, float32) from its hidden states ``h`` ``(L, hidden)``."""
    real = h.astype(mx.float32)
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
    return v


def embed(model, prompts, pooling: Pooling, max_tokens=8192, max_rows=64, chunk=2048):
    """Vectors of token lists ``prompts`` (float32 numpy rows, in order).

    Each prompt runs as a row of its own: no padding and no other row in any of its
    model calls, so every matmul, attention sum and norm it goes through has the shape
    it has for the prompt alone, and its vector is the same bits whatever else the
    request holds (a left-padded batch is not: padded key slots change attention's sum
    order and the BLAS rounds a row by the number of rows). Prompts are queued lazily
    and evaluated together, up to ``max_tokens`` tokens or ``max_rows`` prompts at a time
    (bounds the graph and the activations held at once); ``chunk``: see
    :func:`hidden_states`."""
    out, queued, tokens = [], [], 0
    for prompt in prompts:
        queued.append(pool(hidden_states(model, prompt, chunk), pooling))
        tokens += len(prompt)
        if tokens >= max_tokens or len(queued) == max_rows:
            mx.eval(queued)
            out += queued
            queued, tokens = [], 0
    mx.eval(queued)
    return [np.array(v, dtype=np.float32) for v in out + queued]
