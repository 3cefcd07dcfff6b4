"""OpenAI response objects (chat and text completions, whole and streamed)."""

import json
import time
import uuid


def usage(prompt_tokens, completion_tokens, cached_tokens):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def chat_logprobs(entries):
    """Chat ``logprobs.content`` from engine entries (id, text, logprob, top)."""
    def item(text, lp):
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [dict(item(t, lp), top_logprobs=[item(tt, tlp) for _, tt, tlp in top])
                        for _, t, lp, top in entries],
            "refusal": None}  # required by OpenAI's schema (refusals are never produced)


def completion_logprobs(entries, text_start=0):
    """Text-completion ``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset);
    an echoed prompt's first token has None for its logprob and its top alternatives."""
    offsets, pos = [], text_start
    for _, t, _, _ in entries:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": [t for _, t, _, _ in entries],
            "token_logprobs": [lp for _, _, lp, _ in entries],
            "top_logprobs": [None if top is None else {tt: tlp for _, tt, tlp in top}
                             for _, _, _, top in entries],
            "text_offset": offsets}


class ResponseIds:
    """The id, creation time and model name every object of one response shares."""

    def __init__(self, kind, model):
        self.kind = kind  # "chat" or "text"
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model

    def envelope(self, choices, chunk=False, **extra):
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        if chunk and self.kind == "chat":
            obj += ".chunk"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
               "system_fingerprint": "mlx_lm_batched", "choices": choices}
        out.update(extra)
        return out


def sse(data):
    """One server-sent event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
