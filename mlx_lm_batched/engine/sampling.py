"""How a batch's last-column logits become its next tokens, owned by the ``BatchEngine``.

Two ways, one interface (``sample``, ``filter``, ``extend``):

- :class:`SharedSampling`: one sampler and one list of logits processors for the whole
  batch (``generate_step``); processors see ``(B, T)`` token histories with ``PAD_ID``
  at padding, built here.
- :class:`RowSampling`: each row its own sampler, processors and token context
  (``BatchGenerator``). Rows that share a sampler object are sampled in one call;
  processors get the row's own 1-D context and ``(1, V)`` logits (mlx-lm's convention).

Both keep their per-row state in the engine's row order: the engine calls ``filter``
and ``extend`` with its caches, so nothing outside it holds a list that must follow.
Greedy decoding without processors skips the log-softmax over the vocabulary unless
log-probabilities are wanted.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx

from ..layers import cpu_ops
from ..sampling.samplers import greedy_sampler

PAD_ID = -1  # marks padding in token histories given to logits processors


def log_softmax(logits):
    """Log-probabilities of the last axis (``cpu_ops.log_softmax``)."""
    return cpu_ops.log_softmax(logits, axis=-1)


class TokenContext:
    """A row's token history as a growing 1-D ``mx`` array (amortised appends)."""

    step = 256

    def __init__(self, tokens=()):
        tokens = [int(t) for t in tokens]
        self._size = len(tokens)
        self._buffer = mx.array(tokens + [0] * (-len(tokens) % self.step or 0), dtype=mx.int32)

    def append(self, token):
        """Append a ``(1,)`` array (possibly not yet evaluated)."""
        end = self._size + 1
        if end > self._buffer.size:
            self._buffer = mx.concatenate([self._buffer, mx.zeros((self.step,), mx.int32)])
        self._buffer[self._size : end] = token.astype(mx.int32)
        self._size = end

    @property
    def tokens(self):
        return self._buffer[: self._size]


class SharedSampling:
    """One sampler and one list of batched logits processors for every row."""

    def __init__(self, sampler=None, logits_processors=(), want_logprobs=True):
        self.sampler = sampler or greedy_sampler
        self.processors = list(logits_processors or [])
        self.want_logprobs = want_logprobs
        self.history = None  # (B, T) tokens so far, PAD_ID for padding (processors only)

    def prompt(self, tokens, padding):
        """Record a prefilled ``(B, L)`` prompt (``padding[b]`` pad columns in row b)."""
        if self.processors:
            cols = mx.arange(tokens.shape[1])[None, :]
            hist = mx.where(cols < mx.array(padding)[:, None], PAD_ID, tokens)
            self.history = hist if self.history is None else mx.concatenate([self.history, hist], 1)

    def fed(self, tokens):
        """Record one decode step's ``(B,)`` tokens."""
        if self.processors:
            self.history = mx.concatenate([self.history, tokens[:, None]], axis=1)

    def sample(self, logits):
        """``(B, V)`` logits -> ``(tokens (B,), logprobs (B, V) or None)``."""
        for processor in self.processors:
            logits = processor(self.history, logits)
        if self.sampler is greedy_sampler:
            # The argmax of the logits is that of the log-probabilities, whose
            # log-softmax (an exp over the vocabulary per row) is skipped when unused.
            tokens = mx.argmax(logits, axis=-1)
            return tokens, (log_softmax(logits) if self.want_logprobs else None)
        logprobs = log_softmax(logits)
        return self.sampler(logprobs), logprobs

    def filter(self, keep):
        if self.history is not None:
            self.history = self.history[mx.array(keep, dtype=mx.int32)]

    def extend(self, other):
        if not self.processors:
            return
        if self.history is None or other.history is None:
            raise ValueError("cannot extend: both batches need token histories for processors")
        width = max(self.history.shape[1], other.history.shape[1])
        pad = lambda h: mx.concatenate(  # noqa: E731
            [mx.full((h.shape[0], width - h.shape[1]), PAD_ID, h.dtype), h], axis=1)
        self.history = mx.concatenate([pad(self.history), pad(other.history.astype(self.history.dtype))])


@dataclass(eq=False)
class RowSampler:
    """One row's sampling: its sampler (None: greedy), logits processors and, when it
    has processors, its context: every token before the one being sampled (earlier
    turns, the prompt, what it generated), as mlx-lm's processors expect."""

    sampler: Optional[Callable] = None
    processors: tuple = ()
    context: Optional[TokenContext] = None


class RowSampling:
    """Per-row samplers and processors, in the engine's row order.

    ``token_hook(tokens) -> tokens`` (optional) sees every sampled ``(B,)`` array: a
    tensor-parallel server hands every rank rank 0's tokens through it.
    """

    def __init__(self, rows, want_logprobs=True, token_hook=None):
        self.rows = list(rows)
        self.want_logprobs = want_logprobs
        self.token_hook = token_hook

    def prompt(self, tokens, padding):
        """Nothing to record: each row's context was given with its prompt."""

    def fed(self, tokens):
        for i, r in enumerate(self.rows):
            if r.processors:
                r.context.append(tokens[i : i + 1])

    def sample(self, logits):
        rows = self.rows
        if any(r.processors for r in rows):
            # Start the model step before the processors run: a processor that works on
            # the CPU (a grammar's token mask) then overlaps the device's forward pass.
            mx.async_eval(logits)
            parts = []
            for i, r in enumerate(rows):
                x = logits[i : i + 1]
                for processor in r.processors:
                    x = processor(r.context.tokens, x)
                parts.append(x)
            logits = mx.concatenate(parts, axis=0)
        samplers = [r.sampler or greedy_sampler for r in rows]
        first = samplers[0]
        if all(s is greedy_sampler for s in samplers):
            tokens = mx.argmax(logits, axis=-1)
            logprobs = log_softmax(logits) if self.want_logprobs else None
        else:
            logprobs = log_softmax(logits)
            if all(s is first for s in samplers):
                tokens = first(logprobs)
            else:
                tokens = self._by_sampler(samplers, logprobs)
        if self.token_hook is not None:
            tokens = self.token_hook(tokens)
        return tokens, logprobs

    @staticmethod
    def _by_sampler(samplers, logprobs):
        """One call per distinct sampler object, tokens put back in row order."""
        groups = {}
        for i, s in enumerate(samplers):
            groups.setdefault(id(s), (s, []))[1].append(i)
        order, parts = [], []
        for s, idx in groups.values():
            parts.append(s(logprobs[mx.array(idx)]).reshape(-1).astype(mx.uint32))
            order.extend(idx)
        return mx.concatenate(parts)[mx.argsort(mx.array(order))]

    def filter(self, keep):
        self.rows = [self.rows[i] for i in keep]

    def extend(self, other):
        self.rows = self.rows + other.rows
