"""Per-row logits processors and samplers for a batch whose rows come and go.

``RowOps`` is handed to a :class:`~mlx_lm_batched.batching.BatchEngine` as its one
logits processor (``process``) and its sampler (``sample``); both read the engine's
current rows from a list the scheduler keeps in step with the engine's row order.
Rows that share a sampler object are sampled in one call; processors get each
row's own token context (mlx-lm's convention: a 1-D array of the tokens in the
row's cache including the one just fed, and ``(1, V)`` logits).
"""

import mlx.core as mx

from .sample_utils import greedy_sampler


class TokenContext:
    """A row's token history as a growing 1-D ``mx`` array (amortised appends)."""

    step = 256

    def __init__(self, tokens=()):
        tokens = [int(t) for t in tokens]
        self._size = len(tokens)
        self._buffer = mx.array(tokens + [0] * (-len(tokens) % self.step or 0), dtype=mx.int32)

    def append(self, token):
        """Append a ``(1,)`` array (possibly not yet evaluated); return the history."""
        end = self._size + 1
        if end > self._buffer.size:
            self._buffer = mx.concatenate([self._buffer, mx.zeros((self.step,), mx.int32)])
        self._buffer[self._size : end] = token.astype(mx.int32)
        self._size = end
        return self.tokens

    @property
    def tokens(self):
        return self._buffer[: self._size]


class RowOps:
    """Logits processing and sampling of an engine's rows, each with its own settings.

    ``rows`` is a list of objects with ``sampler``, ``logits_processors`` and
    ``context`` (a :class:`TokenContext` or None); the scheduler keeps it in the
    engine's row order. While ``active`` is False (prefill chunks whose sampled
    token is thrown away) processors are skipped and sampling is a cheap argmax, so
    random samplers consume no random numbers for tokens nobody sees.
    """

    def __init__(self, rows, fallback_sampler=None):
        self.rows = rows
        self.fallback = fallback_sampler or greedy_sampler
        self.active = True

    def process(self, history, logits):
        """Apply each row's processors to its ``(1, V)`` logits (``history`` unused:
        rows keep their own contexts, which include tokens from earlier turns)."""
        if not self.active or not any(r.logits_processors for r in self.rows):
            return logits
        out = []
        for i, row in enumerate(self.rows):
            x = logits[i : i + 1]
            for processor in row.logits_processors:
                x = processor(row.context.tokens, x)
            out.append(x)
        return mx.concatenate(out, axis=0)

    def sample(self, logprobs):
        """``(B, V)`` log-probabilities -> ``(B,)`` tokens, one call per distinct sampler."""
        if not self.active:
            return mx.argmax(logprobs, axis=-1)
        samplers = [r.sampler or self.fallback for r in self.rows]
        first = samplers[0]
        if all(s is first for s in samplers):
            return first(logprobs)
        groups = {}
        for i, s in enumerate(samplers):
            groups.setdefault(id(s), (s, []))[1].append(i)
        order, parts = [], []
        for s, idx in groups.values():
            parts.append(s(logprobs[mx.array(idx)]).reshape(-1).astype(mx.uint32))
            order.extend(idx)
        inverse = mx.argsort(mx.array(order))
        return mx.concatenate(parts)[inverse]
