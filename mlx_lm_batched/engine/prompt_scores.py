"""Log-probabilities of a prompt's own tokens, read from the prefill's logits.

The prefill already computes logits at every prompt column; column ``c`` of row ``b``
predicts the token at column ``c + 1``. A :class:`PromptScores` takes the logits of each
prefill call (for the rows that asked) and keeps, per row, the log-probability of each
next prompt token and its ``top`` most likely alternatives, as plain Python values. The
first real token of a row has no score (nothing precedes it). Each row's scores come
from its own logits only, so they do not depend on the other rows or on the chunking.
"""

import mlx.core as mx

from .sampling import log_softmax


class PromptScores:
    """Scores of the prompt tokens of the rows in ``top`` (``{row: number of top
    alternatives}``) of a left-padded ``(B, L)`` prompt."""

    def __init__(self, tokens, padding, top):
        self.tokens, self.padding = tokens, list(padding)
        self.top = {int(b): int(k) for b, k in top.items()}
        self.length = tokens.shape[1]
        # rows[b]: one (logprob, [(id, logprob), ...]) per real token after the first.
        self.rows = {b: [] for b in self.top}

    def add(self, logits, first_row, first_col):
        """Take the ``(R, n, V)`` logits of rows ``first_row ..`` at columns
        ``first_col ..`` (one prefill call); padding columns and the last column (it
        predicts the first generated token) are skipped."""
        R, n, _ = logits.shape
        for b, k in self.top.items():
            if not first_row <= b < first_row + R:
                continue
            lo = max(first_col, self.padding[b])
            hi = min(first_col + n, self.length - 1)
            if lo >= hi:
                continue
            x = logits[b - first_row, lo - first_col : hi - first_col].astype(mx.float32)
            lp = log_softmax(x)
            nxt = self.tokens[b, lo + 1 : hi + 1].astype(mx.int32)
            chosen = mx.take_along_axis(lp, nxt[:, None], axis=-1)[:, 0]
            if k > 0:
                idx = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
                vals = mx.take_along_axis(lp, idx, axis=-1)
                order = mx.argsort(-vals, axis=-1)
                idx = mx.take_along_axis(idx, order, axis=-1)
                vals = mx.take_along_axis(vals, order, axis=-1)
                mx.eval(chosen, idx, vals)
                tops = [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
            else:
                tops = [[] for _ in range(hi - lo)]
            self.rows[b].extend(zip(chosen.tolist(), tops))

    def of_row(self, b):
        """Row ``b``'s scores: ``[(logprob, [(id, logprob), ...]), ...]``, one per real
        prompt token after the first."""
        return list(self.rows[b])
