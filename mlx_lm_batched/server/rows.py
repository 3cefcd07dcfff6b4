"""Per-row text state in the engine: streaming detokenizer, stop strings, logprobs."""

import mlx.core as mx

from .text_stops import TextStops


class RowState:
    """One choice of one request while it is in the batch."""

    def __init__(self, job, index, tokenizer, stops):
        self.job = job
        self.index = index  # the choice index in the response
        self.uid = None
        self.detok = tokenizer.make_detokenizer()
        self.stops = TextStops(stops)
        self.started = False  # prefill began
        self.prefilled = 0  # prompt tokens fed so far
        self.generated = 0

    def add_token(self, token, finish_reason):
        """Take one generated token; returns ``(text to send, finish reason or None)``.

        ``finish_reason`` is the batch's ("stop": an EOS token, whose text is not
        part of the answer; "length"); a stop string found in the text turns into
        "stop" and cuts the text before it.
        """
        self.generated += 1
        if finish_reason != "stop":
            self.detok.add_token(token)
        if finish_reason is not None:
            self.detok.finalize()
        text, hit = self.stops.feed(self.detok.last_segment, final=finish_reason is not None)
        if hit:
            return text, "stop"
        return text, finish_reason


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
