"""``tool_choice``'s forced forms as a grammar over the model's tool-call format.

``"required"`` forces a call of any of the request's tools, ``{"type": "function",
"function": {"name": N}}`` a call of tool ``N``; its arguments follow the tool's
``parameters`` schema. The format is the Hermes/Qwen block that ``tool_calls.py``
parses (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); the grammar
is Lark with an embedded JSON schema, compiled by the grammar engine.
``"auto"`` (the default) and ``"none"`` (see :func:`tools_for_prompt`) constrain nothing.
"""

import json

from .errors import APIError
from .tool_calls import CLOSE, OPEN


def _check(tools, tool_choice):
    """The forced tool names (None: not forced); APIError(400) for a bad choice."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if not tools:
        raise APIError(400, "'tool_choice' needs 'tools'.", "tool_choice", "invalid_value")
    names = [t.get("function", {}).get("name") for t in tools]
    if tool_choice == "required":
        return names
    if (isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
            and isinstance(tool_choice.get("function"), dict)):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise APIError(400, f"Invalid value for 'tool_choice': no tool is named {name!r}.",
                           "tool_choice", "invalid_value")
        return [name]
    raise APIError(400, f"Invalid value for 'tool_choice': {json.dumps(tool_choice)[:80]} "
                   "(expected 'none', 'auto', 'required' or {\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}).", "tool_choice", "invalid_value")


def tool_choice_grammar(tools, tool_choice):
    """The Lark grammar forcing one tool call, or None when ``tool_choice`` forces none."""
    names = _check(tools, tool_choice)
    if names is None:
        return None
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    calls = [{"type": "object",
              "properties": {"name": {"const": n},
                             "arguments": by_name[n].get("parameters") or {"type": "object"}},
              "required": ["name", "arguments"], "additionalProperties": False}
             for n in names]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return (f"start: {json.dumps(OPEN + chr(10))} call {json.dumps(chr(10) + CLOSE)}\n"
            f"call: %json {json.dumps(schema)}\n")


def tools_for_prompt(tools, tool_choice):
    """The tools the chat template sees: none when ``tool_choice`` is ``"none"``."""
    return None if tool_choice == "none" else tools
