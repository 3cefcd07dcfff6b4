"""The decoder stack (embedding, blocks, final norm) and the ``CausalLM`` shell every
decoder-only architecture shares: it builds the masks from ``offset`` and the caches,
runs the stack and the head."""

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache, max_kv_cache
from . import cpu_ops
from .step import resolve_masks, resolve_offset


class DecoderStack(nn.Module):
    """Embedding, blocks and final norm: HF's ``model.*`` submodule."""

    def __init__(self, vocab_size, hidden_size, layers, norm, embed_scale=None, max_positions=None):
        """``max_positions``: learned absolute position embeddings ``embed_positions``
        (GPT-2), indexed by each row's positions (padding columns clipped to 0)."""
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        if max_positions:
            self.embed_positions = nn.Embedding(max_positions, hidden_size)
        self.layers = layers
        self.norm = norm
        self.embed_scale = embed_scale

    def embed(self, inputs, offset, input_embeddings=None):
        """Hidden states ``(B, L, hidden)`` entering the first block."""
        h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        if self.embed_scale is not None:
            # Python float: stays in the compute dtype instead of being rounded first.
            h = h * self.embed_scale
        if "embed_positions" in self:
            positions = mx.maximum(offset[:, None] + mx.arange(h.shape[1]), 0)
            h = h + self.embed_positions(positions)
        return h

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        cache = cache if cache is not None else [None] * len(self.layers)
        # Only steps that carry attention data pass it: blocks that take none (state
        # layers) keep the four-argument call.
        extra = () if attention is None else (attention,)
        for layer, m, c in zip(self.layers, masks, cache):
            h = layer(h, m, offset, c, *extra)
        return self.norm(h)


class LoopedDecoderStack(DecoderStack):
    """The blocks run ``loops`` times with shared weights (Nanbeige's looped
    decoder). Every pass has its own caches and masks: pass ``i`` uses entries
    ``i * n`` to ``(i + 1) * n`` of them (``n`` blocks), so the model lists
    ``loops * n`` layer windows. ``norm_each_loop``: the final norm closes every
    pass; else it runs once at the end."""

    def __init__(self, vocab_size, hidden_size, layers, norm, loops, norm_each_loop=True):
        super().__init__(vocab_size, hidden_size, layers, norm)
        self.loops = loops
        self.norm_each_loop = norm_each_loop

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        n = len(self.layers)
        cache = cache if cache is not None else [None] * (self.loops * n)
        extra = () if attention is None else (attention,)
        for i in range(self.loops):
            part = slice(i * n, (i + 1) * n)
            for layer, m, c in zip(self.layers, masks[part], cache[part]):
                h = layer(h, m, offset, c, *extra)
            if self.norm_each_loop:
                h = self.norm(h)
        return h if self.norm_each_loop else self.norm(h)


class CausalLM(nn.Module):
    """Shared ``__call__`` of decoder-only language models.

    Subclasses build ``self.model`` (a ``DecoderStack``), optionally ``self.lm_head``,
    and set ``self.layer_windows`` (sliding window per layer, None for global) and,
    for chunked attention (Llama 4), ``self.layer_chunks`` (chunk per layer, None
    for unchunked layers) and, for block-sparse attention (Phi-3-small),
    ``self.layer_block_sparse`` (a ``masks.BlockSparse`` per layer, None for dense
    layers).
    """

    final_logit_softcap = None
    logit_scale = None  # a factor on the final logits (Cohere, Granite)

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 attention=None, **stack_inputs):
        """Logits ``(B, L, vocab)`` for ``inputs`` ``(B, L)``.

        ``offset``: ``(B,)`` position of each row's first column (negative for left
        padding); ``mask``: one boolean array, a list per layer, or None to build
        the masks from ``offset`` and ``cache``; ``attention``: the driver's
        per-step :class:`~.base.StepAttention` (decode row groups), or None;
        ``stack_inputs``: further inputs the family's stack takes by keyword.
        """
        offset = resolve_offset(inputs, offset, cache)
        masks = resolve_masks(mask, cache, self.layer_windows, inputs.shape[1], offset,
                              self.get("layer_chunks"), self.get("layer_block_sparse"))
        h = self.model(inputs, masks, offset, cache, input_embeddings, attention, **stack_inputs)
        if hasattr(self, "lm_head"):
            out = cpu_ops.linear(self.lm_head, h)
        else:
            out = cpu_ops.tied_logits(self.model.embed_tokens, h)
        if self.logit_scale is not None:
            out = out * self.logit_scale
        if self.final_logit_softcap is not None:
            out = mx.tanh(out / self.final_logit_softcap) * self.final_logit_softcap
        return out

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self, max_kv_size=None):
        """A full cache per global layer, a rotating one per windowed or chunked
        layer (a query never sees more than ``chunk`` slots back, so a ring of
        ``chunk`` slots is exact); with ``max_kv_size`` every layer keeps at most that
        many slots."""
        chunks = self.get("layer_chunks") or [None] * len(self.layer_windows)
        caches = []
        for w, c in zip(self.layer_windows, chunks):
            bounds = [b for b in (w, c, max_kv_size) if b is not None]
            if w is None and c is None and max_kv_size is not None:
                caches.append(max_kv_cache(max_kv_size))  # mlx-lm's: keeps 4 sinks
            else:
                caches.append(RotatingKVCache(min(bounds)) if bounds else KVCache())
        return caches

    def sanitize(self, weights):
        """Drop buffers HF checkpoints carry that are not parameters here."""
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if not hasattr(self, "lm_head"):
            weights.pop("lm_head.weight", None)
            weights.pop("lm_head.scales", None)
            weights.pop("lm_head.biases", None)
        return weights
