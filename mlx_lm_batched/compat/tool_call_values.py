"""Argument values of mlx-lm's tool-call parsers: the types a tool's JSON schema gives
its parameters, and the raw text of a value decoded the way mlx-lm's family modules
decode it (``mlx_lm.tool_parsers.<family>.parse_tool_call(text, tools)``)."""

import ast
import json

_STRING_TYPES = ("string",)


def parameter_types(tool_name, tools):
    """``{parameter: schema type}`` of the tool called ``tool_name`` in OpenAI's
    ``tools`` list (a type may be a list, e.g. ``["string", "null"]``); empty when the
    tool or its schema is absent."""
    for tool in tools or ():
        function = tool.get("function") or {}
        if function.get("name") == tool_name:
            properties = (function.get("parameters") or {}).get("properties") or {}
            return {k: (v or {}).get("type") for k, v in properties.items()
                    if isinstance(v, dict)}
    return {}


def is_string_type(schema_type):
    """Whether a schema type keeps the value as text (a list: when a string is among it)."""
    if isinstance(schema_type, list):
        return any(is_string_type(t) for t in schema_type)
    return isinstance(schema_type, str) and schema_type.lower() in _STRING_TYPES


def literal(text):
    """``text`` as JSON, else as a Python literal (histories render dicts in Python
    style), else None when it is neither."""
    for decode in (json.loads, ast.literal_eval):
        try:
            return decode(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return None


def decode_value(raw, schema_type, untyped="any"):
    """The value of one argument whose text is ``raw``.

    A string type keeps the text; another type decodes it (JSON, then a Python
    literal), keeping the text when neither parses. Without a type, ``untyped`` says
    what decodes: ``"any"`` every literal, ``"containers"`` only JSON objects and lists,
    ``"none"`` nothing."""
    if is_string_type(schema_type) or (schema_type is None and untyped == "none"):
        return raw
    if schema_type is None and untyped == "containers":
        try:
            value = json.loads(raw, strict=False)
        except ValueError:
            return raw
        return value if isinstance(value, (dict, list)) else raw
    value = literal(raw.strip())
    return raw if value is None and raw.strip() not in ("null", "None") else value


def one_or_list(calls):
    """mlx-lm's result: the call itself when there is one, else the list."""
    if not calls:
        raise ValueError("no tool call found in the text")
    return calls[0] if len(calls) == 1 else calls
