"""Families whose calls look like function calls: ``gemma4`` and ``function_gemma``
(``call:f{key:value,...}`` with their own string delimiters) and ``pythonic``
(``[f(a=1), g(b="x")]``, Llama 3.2/4 and LFM2)."""

import ast
import json
import re

from .calls import load_json

_CALL = re.compile(r"call:([\w.-]+)\s*(\{.*\})\s*$", re.DOTALL)


def braced_to_json(args, quote):
    """``{key:<q>text<q>,n:5,inner:{...}}`` as JSON: strings between ``quote`` delimiters
    become JSON strings (whatever they hold), bare keys get quotes."""
    parts = args.split(quote)
    if len(parts) % 2 == 0:
        raise ValueError(f"unbalanced {quote} string delimiters")
    strings = parts[1::2]
    skeleton = "".join(p if i % 2 == 0 else f"\x00{i // 2}\x00" for i, p in enumerate(parts))
    skeleton = re.sub(r"(?<=[{,])\s*([A-Za-z_][\w-]*)\s*:", r'"\1":', skeleton)
    text = re.sub(r"\x00(\d+)\x00", lambda m: json.dumps(strings[int(m.group(1))]), skeleton)
    return load_json(text)


def _call_syntax(body, quote):
    m = _CALL.match(body.strip())
    if m is None:
        raise ValueError("expected call:name{...}")
    return [(m.group(1), braced_to_json(m.group(2), quote))]


def parse_gemma4(body):
    """``call:f{city:<|"|>Paris<|"|>,days:3}`` (Gemma 4)."""
    return _call_syntax(body, '<|"|>')


def parse_function_gemma(body):
    """``call:f{city:<escape>Paris<escape>,days:3}`` (FunctionGemma)."""
    return _call_syntax(body, "<escape>")


def parse_pythonic(body):
    """``[f(a=1, b="x"), g()]``: keyword arguments that are Python literals."""
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError("not a Python list of calls") from None
    calls = tree.elts if isinstance(tree, ast.List) else [tree]
    out = []
    for c in calls:
        if not isinstance(c, ast.Call) or c.args:
            raise ValueError("each tool call must be name(keyword=value, ...)")
        name = ast.unparse(c.func)
        try:
            out.append((name, {k.arg: ast.literal_eval(k.value) for k in c.keywords}))
        except ValueError:
            raise ValueError(f"arguments of {name} must be literals") from None
    return out
