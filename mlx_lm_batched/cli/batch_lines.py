"""One line of an OpenAI Batch input file: checked and turned into token ids and
sampling settings, or a :class:`LineError` naming what is wrong with that line only."""

import json
from dataclasses import dataclass, field
from typing import Any, Optional

URLS = ("/v1/chat/completions", "/v1/completions")
# Body fields that do not change the output (kept out of the check below).
INERT = {"model", "user", "metadata", "store", "stream_options"}
SAMPLING = {"max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
            "seed", "stop", "n", "stream"}
CHAT_ONLY = {"messages", "tools", "tool_choice", "chat_template_kwargs"}


class LineError(ValueError):
    """A problem with one input line: ``code`` and a one-line message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


@dataclass
class Request:
    """A line ready for the batch."""

    custom_id: Optional[str]
    url: str
    tokens: list
    max_tokens: int
    sampling: dict = field(default_factory=dict)  # make_sampler keywords
    seed: Optional[int] = None
    stop: list = field(default_factory=list)
    tools: Any = None


def _number(body, key, kind, lo=None, hi=None, default=None):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        raise LineError("invalid_value", f"'{key}' must be a number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise LineError("invalid_value", f"'{key}' is out of range: {value!r}")
    return value


def parse_line(text, tokenizer, context, default_max_tokens, vocab_size=None):
    """``(custom_id, Request)``; raises :class:`LineError` (``custom_id`` on it when known)."""
    try:
        line = json.loads(text)
    except ValueError as e:
        raise LineError("invalid_json", f"the line is not JSON: {e}") from None
    if not isinstance(line, dict):
        raise LineError("invalid_request", "the line must be a JSON object")
    custom_id = line.get("custom_id")
    try:
        req = _request(line, custom_id, tokenizer, context, default_max_tokens)
        bad = next((t for t in req.tokens if vocab_size and not 0 <= t < vocab_size), None)
        if bad is not None:
            raise LineError("invalid_value", f"token id {bad} is outside the vocabulary "
                            f"[0, {vocab_size})")
        return custom_id, req
    except LineError as e:
        e.custom_id = custom_id
        raise


def _request(line, custom_id, tokenizer, context, default_max_tokens):
    url, body = line.get("url"), line.get("body")
    if line.get("method", "POST") != "POST":
        raise LineError("invalid_request", "'method' must be POST")
    if url not in URLS:
        raise LineError("invalid_url", f"'url' must be one of {', '.join(URLS)}, got {url!r}")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "'body' must be a JSON object")
    chat = url == URLS[0]
    allowed = INERT | SAMPLING | (CHAT_ONLY if chat else {"prompt"})
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise LineError("unsupported_field", f"'{unknown[0]}' is not supported by run_batch")
    if body.get("n", 1) != 1:
        raise LineError("unsupported_value", "'n' must be 1 in a batch file")
    if body.get("stream", False):
        raise LineError("unsupported_value", "'stream' must be false in a batch file")
    tools = body.get("tools") if chat else None
    if chat:
        choice = body.get("tool_choice", "auto")
        if choice not in ("auto", "none"):
            raise LineError("unsupported_value", "'tool_choice' must be 'auto' or 'none' (forced "
                            "calls need constrained decoding)")
        tools = tools if choice == "auto" and tools else None
        tokens = _chat_tokens(tokenizer, body, tools)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            from ..tokenization.tokenizer import encode_prompt

            tokens = encode_prompt(tokenizer, prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            tokens = list(prompt)
        else:
            raise LineError("invalid_value", "'prompt' must be a non-empty string or token ids")
    if len(tokens) >= context:
        raise LineError("context_length_exceeded",
                        f"the prompt has {len(tokens)} tokens; the model's context is {context}")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = _number({"max_tokens": limit}, "max_tokens", int, lo=1, default=default_max_tokens)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise LineError("invalid_value", "'stop' must be a string or a list of strings")
    top_p = _number(body, "top_p", (int, float), 0, 1, 1.0)
    sampling = dict(temp=_number(body, "temperature", (int, float), 0, 2, 0.0),
                    top_p=0.0 if top_p == 1.0 else top_p,
                    top_k=_number(body, "top_k", int, 0, None, 0),
                    min_p=_number(body, "min_p", (int, float), 0, 1, 0.0))
    return Request(custom_id, url, tokens, min(limit, context - len(tokens)), sampling,
                   _number(body, "seed", int, 0, None, None), stop, tools)


def _chat_tokens(tokenizer, body, tools):
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise LineError("invalid_value", "'messages' must be a non-empty list")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise LineError("invalid_value", "'chat_template_kwargs' must be a JSON object")
    try:
        return list(tokenizer.apply_chat_template(messages, tools=tools,
                                                  add_generation_prompt=True, **kwargs))
    except Exception as e:  # jinja raises on messages the template does not accept
        raise LineError("invalid_value", f"the chat template rejected 'messages': "
                        f"{' '.join(str(e).split())}") from None
