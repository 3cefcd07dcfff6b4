"""Per-row state in the server's engine: the row's text (``sched.row_text.RowText``), its
request and its progress."""

import mlx.core as mx

from ..sched.row_text import RowText


class RowState:
    """One choice of one request while it is in the batch."""

    def __init__(self, job, index, tokenizer, params, echo=None, max_tokens=None, kv=None):
        self.job = job
        self.index = index  # the choice index in the response
        self.uid = None
        self.max_tokens = max_tokens  # tokens it may generate in all
        self.kv = kv  # its KV reservation (server.kv_admission.KVGrant), None: unbounded
        self.parked = None  # its KV while preempted (the prefix cache's park)
        skip = getattr(tokenizer, "all_special_ids", ()) if params.skip_special_tokens else ()
        self.text = RowText(tokenizer, params.stop, params.include_stop_str, skip)
        self.echo = echo  # (prompt text, its tokens) of an echo row, sent once it is prefilled
        self.started = False  # prefill began
        self.prefilled = 0  # prompt tokens fed so far
        self.generated = 0

    def add_token(self, token, finish_reason):
        """Take one generated token; returns ``(text to send, finish reason or None)``
        (see ``RowText.add``: a stop string turns into "stop")."""
        self.generated += 1
        return self.text.add(token, finish_reason)


def prompt_logprobs(tokenizer, tokens, scores):
    """Engine entries ``(id, text, logprob, top)`` of a prompt from the generator's
    ``scores`` (one per token after the first, whose logprob and top are None)."""
    entries = [(int(tokens[0]), tokenizer.decode([int(tokens[0])]), None, None)]
    for t, (lp, top) in zip(tokens[1:], scores):
        entries.append((int(t), tokenizer.decode([int(t)]), lp,
                        [(i, tokenizer.decode([i]), v) for i, v in top]))
    return entries


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
