"""``parse_tool_call`` of mlx-lm's tool-parser modules for three families whose calls
this package's server does not detect from a chat template: ``kimi_k3`` (Kimi K3's
``<|open|>call ...<|sep|>`` blocks), ``minicpm5`` (``<function name="f"><param
name="a">v</param></function>``) and ``muse_spark`` (``<atem:invoke>`` markup). Results
as in ``compat/tool_call_families.py``."""

import html
import re

from ..tool_parsers.calls import json_value, load_json
from .tool_call_values import decode_value, one_or_list, parameter_types

_K3_CALL = re.compile(r"<\|open\|>call\b([^<]*?)<\|sep\|>(.*?)<\|close\|>call<\|sep\|>",
                      re.DOTALL)
_K3_PART = re.compile(r"<\|open\|>(argument|json)\b([^<]*?)<\|sep\|>(.*?)"
                      r"<\|close\|>\1<\|sep\|>", re.DOTALL)
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')


def _attributes(text):
    return {k: html.unescape(v) for k, v in _ATTR.findall(text)}


def _k3_call(head, body):
    """One call's dict, or None when it is malformed (no tool name, bad JSON)."""
    name = _attributes(head).get("tool")
    if not name:
        return None
    arguments = {}
    for kind, attrs, value in _K3_PART.findall(body):
        attrs = _attributes(attrs)
        try:
            if kind == "json":
                block = load_json(value)
                if not isinstance(block, dict):
                    return None
                arguments.update(block)
            elif attrs.get("type") == "string":
                arguments[attrs["key"]] = value
            else:
                arguments[attrs["key"]] = load_json(value)
        except (ValueError, KeyError):
            return None
    return {"name": name, "arguments": arguments}


def kimi_k3_parse_tool_call(text, tools=None):
    """Every complete, well-formed ``<|open|>call tool="f" ...<|close|>call<|sep|>`` block
    (a malformed or truncated one is skipped): always a list."""
    calls = [c for c in (_k3_call(h, b) for h, b in _K3_CALL.findall(text)) if c is not None]
    if not calls:
        raise ValueError("no well-formed <|open|>call block in the Kimi K3 tool section")
    return calls


_CPM_FUNCTION = re.compile(r"""(?:<function\s+name=)?\s*["']([^"'>]+)["']\s*>(.*?)"""
                           r"(?:</function>|(?=<function\b)|$)", re.DOTALL)
_CPM_PARAM = re.compile(r"""<param\s+name=["']([^"']+)["']\s*>(.*?)</param>""", re.DOTALL)
_CDATA = re.compile(r"^\s*<!\[CDATA\[(.*)\]\]>\s*$", re.DOTALL)


def minicpm5_parse_tool_call(text, tools=None):
    """``<function name="f"><param name="a">value</param></function>``, one or more (the
    start marker ``<function name=`` may already be stripped); a truncated parameter is
    dropped, a ``CDATA`` section is kept verbatim, other text is stripped; a value is
    decoded only when the tool's schema types it as something other than a string."""
    calls = []
    for name, body in _CPM_FUNCTION.findall(text):
        types = parameter_types(name, tools)
        arguments = {}
        for key, raw in _CPM_PARAM.findall(body):
            cdata = _CDATA.match(raw)
            arguments[key] = (cdata.group(1) if cdata
                              else decode_value(raw.strip(), types.get(key), untyped="none"))
        calls.append({"name": name, "arguments": arguments})
    return one_or_list(calls)


_ATEM_INVOKE = re.compile(r'<atem:invoke\b[^>]*?\bname="([^"]+)">'
                          r"((?:<atem:parameter\b.*?</atem:parameter>|.)*?)"
                          r"(?:</atem:invoke>|$)", re.DOTALL)
_ATEM_PARAM = re.compile(r'<atem:parameter\b[^>]*?\bname="([^"]+)"[^>]*?>(.*?)'
                         r"</atem:parameter>", re.DOTALL)


def muse_spark_parse_tool_call(text, tools=None):
    """``<atem:invoke name="f"><atem:parameter name="a">v</atem:parameter></atem:invoke>``,
    one or more; a value is JSON when it parses, else its stripped text."""
    calls = [{"name": name, "arguments": {k: json_value(v) for k, v in _ATEM_PARAM.findall(body)}}
             for name, body in _ATEM_INVOKE.findall(text)]
    return one_or_list(calls)
