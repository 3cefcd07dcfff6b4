"""Per-row state in the server's engine: the row's text (``sched.output.RowText``), its
request and its progress."""

import mlx.core as mx

from ..sched.output import RowText


class RowState:
    """One choice of one request while it is in the batch."""

    def __init__(self, job, index, tokenizer, stops):
        self.job = job
        self.index = index  # the choice index in the response
        self.uid = None
        self.text = RowText(tokenizer, stops)
        self.started = False  # prefill began
        self.prefilled = 0  # prompt tokens fed so far
        self.generated = 0

    def add_token(self, token, finish_reason):
        """Take one generated token; returns ``(text to send, finish reason or None)``
        (see ``RowText.add``: a stop string turns into "stop")."""
        self.generated += 1
        return self.text.add(token, finish_reason)


def token_logprobs(tokenizer, token, logprobs, top):
    """``(token id, text, logprob, [(id, text, logprob) of the top ``top``])`` of one step."""
    lp = logprobs.reshape(-1)
    chosen = float(lp[token].item())
    best = []
    if top > 0:
        idx = mx.argpartition(-lp, kth=top - 1)[:top]
        vals = lp[idx]
        order = mx.argsort(-vals)
        ids, values = idx[order].tolist(), vals[order].tolist()
        best = [(i, tokenizer.decode([i]), float(v)) for i, v in zip(ids, values)]
    return (int(token), tokenizer.decode([int(token)]), chosen, best)
