"""The batch driver: it alone owns each row's padding and position.

A ``BatchEngine`` runs one left-padded batch through a model: chunked prefill, then
one decode step at a time. It keeps ``left_padding`` (pad slots per row) and
``offset`` (real tokens per row in the cache) and hands the model the position of
each row's first input column; the model builds masks from that and its caches.
Rows can be dropped (``filter``) so finished rows stop costing compute.
"""

import mlx.core as mx

from .models.cache import make_prompt_cache

PAD_ID = -1  # marks padding in token histories given to logits processors


def left_pad(prompts, pad_id=0):
    """``(B, L)`` array of left-padded prompts and the ``(B,)`` padding per row."""
    width = max(len(p) for p in prompts)
    padding = [width - len(p) for p in prompts]
    rows = [[pad_id] * n + [int(t) for t in p] for n, p in zip(padding, prompts)]
    return mx.array(rows, dtype=mx.int32), padding


def greedy(logprobs):
    return mx.argmax(logprobs, axis=-1)


class BatchEngine:
    """Prefill and decode one batch of rows that share a cache."""

    def __init__(
        self,
        model,
        sampler=None,
        logits_processors=None,
        prompt_cache=None,
        max_kv_size=None,
        prefill_step_size=2048,
    ):
        self.model = model
        self.sampler = sampler or greedy
        self.logits_processors = list(logits_processors or [])
        self.cache = prompt_cache if prompt_cache is not None else make_prompt_cache(model, max_kv_size)
        self.prefill_step_size = max(1, int(prefill_step_size))
        self.offset = None  # mx (B,) real tokens per row in the cache
        self.history = None  # (B, T) tokens so far, PAD_ID for padding (processors only)

    @property
    def slots(self):
        return self.cache[0].size if self.cache else 0

    @property
    def left_padding(self):
        """Pad slots per row: every row fills the same number of slots."""
        return self.slots - self.offset

    def prefill(self, tokens, left_padding=None, progress=None, input_embeddings=None):
        """Feed the ``(B, L)`` prompt; return the queued ``(tokens, logprobs)`` of step one.

        All columns but the last go through the model in chunks whose logits are
        never computed (only the caches are evaluated); the last column gives the
        first sampled token.
        """
        B, L = tokens.shape
        if L == 0:
            raise ValueError("empty prompt: nothing to generate from")
        pad = mx.array(left_padding if left_padding is not None else [0] * B, dtype=mx.int32)
        start = self.slots
        if start and left_padding is not None and any(left_padding):
            raise ValueError("left padding cannot follow an existing prompt cache")
        if self.offset is None:
            self.offset = mx.full((B,), start, dtype=mx.int32)
        if self.logits_processors:
            cols = mx.arange(L)[None, :]
            hist = mx.where(cols < pad[:, None], PAD_ID, tokens)
            self.history = hist if self.history is None else mx.concatenate([self.history, hist], 1)
        # Position of column c in row b: cached real tokens + c - padding of row b.
        base = self.offset - pad
        done = 0
        while L - done > 1:
            n = min(self.prefill_step_size, L - done - 1)
            emb = None if input_embeddings is None else input_embeddings[:, done : done + n]
            self.model(tokens[:, done : done + n], offset=base + done, cache=self.cache,
                       **({"input_embeddings": emb} if emb is not None else {}))
            mx.eval([c.state for c in self.cache])
            done += n
            if progress is not None:
                progress(done, L)
        emb = None if input_embeddings is None else input_embeddings[:, done:]
        logits = self.model(tokens[:, done:], offset=base + done, cache=self.cache,
                            **({"input_embeddings": emb} if emb is not None else {}))
        self.offset = base + L
        return self._sample(logits[:, -1, :])

    def step(self, tokens):
        """Feed one token per row ``(B,)``; return the queued next ``(tokens, logprobs)``."""
        if self.logits_processors:
            self.history = mx.concatenate([self.history, tokens[:, None]], axis=1)
        logits = self.model(tokens[:, None], offset=self.offset, cache=self.cache)
        self.offset = self.offset + 1
        return self._sample(logits[:, -1, :])

    def _sample(self, logits):
        for processor in self.logits_processors:
            logits = processor(self.history, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampler(logprobs), logprobs

    def filter(self, keep):
        """Keep only rows ``keep`` (list of indices); drop padding they all share."""
        idx = mx.array(keep, dtype=mx.int32)
        for c in self.cache:
            c.filter(idx)
        self.offset = self.offset[idx]
        if self.history is not None:
            self.history = self.history[idx]
        shared = int(mx.min(self.left_padding).item()) if len(keep) else 0
        # Once a ring has wrapped its leading slots are gone already; keep the frame.
        if shared > 0 and all(c.size <= getattr(c, "max_size", c.size) for c in self.cache):
            for c in self.cache:
                c.drop_leading(shared)
