"""``tool_choice`` as a grammar over the model's tool-call format.

``"required"`` forces calls of any of the request's tools (one or more when parallel
calls are on, exactly one when off), ``{"type": "function", "function": {"name": N}}``
one call of tool ``N``; their arguments follow the tool's ``parameters`` schema. The
format is the Hermes/Qwen block that ``tool_calls.py`` parses (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); the grammar
is Lark with an embedded JSON schema, compiled by the grammar engine.
``"auto"`` (the default) constrains a call once it starts for the generic tool format
(``tool_format.py``) and nothing otherwise; ``"none"`` (see :func:`tools_for_prompt`)
constrains nothing.
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


def _call_schema(tools, names):
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    calls = [{"type": "object",
              "properties": {"name": {"const": n},
                             "arguments": by_name[n].get("parameters") or {"type": "object"}},
              "required": ["name", "arguments"], "additionalProperties": False}
             for n in names]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def tool_choice_grammar(tools, tool_choice, parallel=True, lazy=False):
    """The Lark grammar of ``tool_choice``, or None when it constrains nothing.

    Forced forms: a named function is called once; ``"required"`` makes one call, or
    (``parallel``: OpenAI's ``parallel_tool_calls``, true by default) one or more, one
    per line. ``lazy`` (the generic tool format, see
    ``tool_format.py``) also constrains ``"auto"``: text is free until the model writes
    the call's start marker, then the call follows the tools' schemas, then text is free
    again (``parallel``) or the output ends."""
    names = _check(tools, tool_choice)
    if names is None:
        if not (lazy and tools and tool_choice != "none"):
            return None
        names = [t.get("function", {}).get("name") for t in tools]
        body = (f"body: {json.dumps(chr(10))} %json {json.dumps(_call_schema(tools, names))} "
                f"{json.dumps(chr(10) + CLOSE)}\n")
        # ``text`` is lazy: it ends at the first start marker, which it consumes;
        # ``TAIL`` is the text after the last call, which holds no start marker.
        free = (f"text[stop={json.dumps(OPEN)}]: /(.|\\n)*/\n"
                f"tail: TAIL\nTAIL: /(.|\\n)*/ & ~/(.|\\n)*{_regex_literal(OPEN)}(.|\\n)*/\n")
        start = "start: (text body)* tail\n" if parallel else "start: tail | text body\n"
        return start + free + body
    call = (f"call: {json.dumps(OPEN + chr(10))} %json {json.dumps(_call_schema(tools, names))} "
            f"{json.dumps(chr(10) + CLOSE)}\n")
    # One call per line, as Hermes/Qwen templates write several (the parser drops the
    # newlines between calls from the content); a named function is called once.
    several = parallel and tool_choice == "required"
    start = f"start: call ({json.dumps(chr(10))} call)*\n" if several else "start: call\n"
    return start + call


def _regex_literal(text):
    return "".join("\\" + c if c in "\\/.^$*+?()[]{}|-" else c for c in text)


def tools_for_prompt(tools, tool_choice):
    """The tools the chat template sees: none when ``tool_choice`` is ``"none"``."""
    return None if tool_choice == "none" else tools
