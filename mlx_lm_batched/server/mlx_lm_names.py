"""The names of mlx-lm's ``mlx_lm.server`` that code and tests written for it import:
``LRUPromptCache`` (mlx-lm's store, ``cache/mlx_lm_lru.py``; the server here keeps its
own, ``sched/prefix_cache.py``), ``SamplingArguments``, ``_make_sampler`` and
``ToolCallFormatter`` with mlx-lm's behaviour, and mlx-lm's ``http.server`` classes (``APIHandler``, ``ResponseGenerator``),
which raise on construction: the server here is an ASGI app on one engine thread
(``create_app``), with the same HTTP API."""

import json
import logging
import uuid
from dataclasses import dataclass

from ..cache.mlx_lm_lru import MlxLmLRUPromptCache as LRUPromptCache
from ..sampling.samplers import make_sampler


@dataclass
class SamplingArguments:
    """A request's sampling settings, as mlx-lm's server holds them."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    xtc_probability: float
    xtc_threshold: float


def _make_sampler(args, tokenizer):
    """The sampler of ``args.sampling`` (a :class:`SamplingArguments`); XTC never drops
    a newline or an end-of-sequence token."""
    s = args.sampling
    return make_sampler(s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                        xtc_probability=s.xtc_probability, xtc_threshold=s.xtc_threshold,
                        xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids))


class ToolCallFormatter:
    """Raw tool-call texts -> OpenAI ``tool_calls`` entries through a family's
    ``parse_tool_call(text, tools)``; a text that does not parse (a call cut off by the
    token limit) is logged and skipped. ``streaming=True`` numbers the entries."""

    def __init__(self, tool_parser, tools, streaming=False):
        self._parse, self._tools, self._streaming = tool_parser, tools, streaming
        self._index = 0

    def _entry(self, call):
        call = dict(call)
        call_id = call.pop("id", None) or str(uuid.uuid4())
        call["arguments"] = json.dumps(call["arguments"], ensure_ascii=False)
        entry = {"function": call, "type": "function", "id": call_id}
        if self._streaming:
            entry["index"], self._index = self._index, self._index + 1
        return entry

    def __call__(self, tool_texts):
        entries = []
        for text in tool_texts or ():
            try:
                parsed = self._parse(text, self._tools)
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                logging.warning("tool call not parsed (%s: %s); skipped", type(e).__name__, e)
                continue
            entries.extend(self._entry(c) for c in (parsed if isinstance(parsed, list)
                                                    else [parsed]))
        return entries


class _HttpServerClass:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"mlx-lm's server.{type(self).__name__} (http.server) is not part of "
            "mlx_lm_batched: its server is the ASGI app of mlx_lm_batched.server.create_app "
            "(python -m mlx_lm_batched.server), with the same HTTP API")


class APIHandler(_HttpServerClass):
    """Not provided (mlx-lm's ``http.server`` request handler)."""


class ResponseGenerator(_HttpServerClass):
    """Not provided (mlx-lm's generation thread behind ``APIHandler``)."""
