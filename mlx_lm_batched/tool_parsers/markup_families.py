"""Families whose calls are XML-like markup: ``qwen3_coder``, ``glm47``, ``minimax_m2``
and ``longcat`` (JSON or GLM-style pairs). Argument values are JSON when they parse (numbers, booleans, objects),
else strings."""

import re

from .calls import json_value
from .json_families import parse_json_tools

_QWEN_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
QWEN_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _trim_newlines(value):
    """The value between a tag and its closing tag, without the template's newlines."""
    return value[1:] if value.startswith("\n") else value


def qwen_value(text):
    """A ``<parameter=...>`` value: JSON when it parses, else the text between the
    newlines the template writes around it."""
    return json_value(_trim_newlines(text).removesuffix("\n"))


def parse_qwen3_coder(body):
    """``<function=f>\\n<parameter=a>\\nvalue\\n</parameter>\\n</function>``."""
    calls = []
    for name, inner in _QWEN_FUNCTION.findall(body):
        args = {k.strip(): qwen_value(v) for k, v in QWEN_PARAM.findall(inner)}
        calls.append((name.strip(), args))
    if not calls:
        raise ValueError("no <function=...> in the tool call")
    return calls


def _key_value_pairs(tag):
    return re.compile(rf"<{tag}_key>(.*?)</{tag}_key>\s*<{tag}_value>(.*?)</{tag}_value>", re.DOTALL)


GLM_PAIR, LONGCAT_PAIR = _key_value_pairs("arg"), _key_value_pairs("longcat_arg")


def named_pairs_head(body, tag):
    """The function name before the first ``<{tag}_key>``; ValueError when it is not one."""
    name = body.split(f"<{tag}_key>", 1)[0].strip()
    if not name or "<" in name or "{" in name:
        raise ValueError("a key/value tool call starts with the function name")
    return name


def _named_pairs(body, tag, pairs):
    name = named_pairs_head(body, tag)
    return [(name, {k.strip(): json_value(v) for k, v in pairs.findall(body)})]


def parse_glm47(body):
    """``f<arg_key>a</arg_key><arg_value>value</arg_value>...`` (GLM 4.5-4.7)."""
    return _named_pairs(body, "arg", GLM_PAIR)


def parse_longcat(body):
    """``{"name": "f", "arguments": {...}}`` (LongCat-Flash) or
    ``f<longcat_arg_key>a</longcat_arg_key><longcat_arg_value>v</longcat_arg_value>...``
    (later LongCat models), as mlx-lm's longcat parser reads both."""
    if body.strip().startswith("{"):
        return parse_json_tools(body)
    return _named_pairs(body, "longcat_arg", LONGCAT_PAIR)


_MINIMAX_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
MINIMAX_PARAM = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


def parse_minimax_m2(body):
    """``<invoke name="f"><parameter name="a">value</parameter></invoke>``, one or more."""
    calls = [(name, {k: json_value(v.strip("\n")) for k, v in MINIMAX_PARAM.findall(inner)})
             for name, inner in _MINIMAX_INVOKE.findall(body)]
    if not calls:
        raise ValueError('no <invoke name="..."> in the MiniMax tool call')
    return calls
