"""Families whose calls carry JSON: Hermes/Qwen ``json_tools``, ``longcat``, ``mistral``
and ``kimi_k2``. Each parser takes the text between the family's markers and returns
``[(name, arguments), ...]``, raising ValueError when it is not a call."""

import re

from .calls import load_json, named_call
from .streamed_calls import kimi_name


def parse_json_tools(body):
    """``{"name": "f", "arguments": {...}}`` (Hermes, Qwen 2.5/3, many fine-tunes)."""
    return [named_call(load_json(body.strip()))]


def parse_mistral(body):
    """``f[ARGS]{...}`` (Mistral v11+ templates), ``f[CALL_ID]id[ARGS]{...}`` (Mistral
    Small 3.2, whose template writes each call's id) or ``[{"name": ..., "arguments": ...}]``."""
    body = body.strip()
    if "[ARGS]" in body:
        head, _, args = body.partition("[ARGS]")
        name = head.partition("[CALL_ID]")[0].strip()
        if not name:
            raise ValueError("a Mistral tool call needs a name before [ARGS]")
        return [(name, load_json(args.strip()))]
    data = load_json(body)
    return [named_call(d) for d in (data if isinstance(data, list) else [data])]


_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)"
                        r"<\|tool_call_end\|>", re.DOTALL)


def parse_kimi_k2(body):
    """``<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{...}<|tool_call_end|>``,
    one or more inside the section markers."""
    calls = []
    for ident, args in _KIMI_CALL.findall(body):
        calls.append((kimi_name(ident), load_json(args.strip())))
    if not calls:
        raise ValueError("no <|tool_call_begin|> call in the Kimi tool-call section")
    return calls
