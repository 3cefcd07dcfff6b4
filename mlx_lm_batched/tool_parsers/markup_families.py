"""Families whose calls are XML-like markup: ``qwen3_coder``, ``glm47`` and
``minimax_m2``. Argument values are JSON when they parse (numbers, booleans, objects),
else strings."""

import re

from .calls import json_value

_QWEN_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_QWEN_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _trim_newlines(value):
    """The value between a tag and its closing tag, without the template's newlines."""
    return value[1:] if value.startswith("\n") else value


def parse_qwen3_coder(body):
    """``<function=f>\\n<parameter=a>\\nvalue\\n</parameter>\\n</function>``."""
    calls = []
    for name, inner in _QWEN_FUNCTION.findall(body):
        args = {k.strip(): json_value(_trim_newlines(v).removesuffix("\n"))
                for k, v in _QWEN_PARAM.findall(inner)}
        calls.append((name.strip(), args))
    if not calls:
        raise ValueError("no <function=...> in the tool call")
    return calls


_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_glm47(body):
    """``f<arg_key>a</arg_key><arg_value>value</arg_value>...`` (GLM 4.5-4.7)."""
    name = body.split("<arg_key>", 1)[0].strip()
    if not name or "<" in name:
        raise ValueError("a GLM tool call starts with the function name")
    return [(name, {k.strip(): json_value(v) for k, v in _GLM_PAIR.findall(body)})]


_MINIMAX_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
_MINIMAX_PARAM = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


def parse_minimax_m2(body):
    """``<invoke name="f"><parameter name="a">value</parameter></invoke>``, one or more."""
    calls = [(name, {k: json_value(v.strip("\n")) for k, v in _MINIMAX_PARAM.findall(inner)})
             for name, inner in _MINIMAX_INVOKE.findall(body)]
    if not calls:
        raise ValueError('no <invoke name="..."> in the MiniMax tool call')
    return calls
