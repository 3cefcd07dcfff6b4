"""``parse_tool_call(text, tools=None)`` of each of mlx-lm's tool-parser modules
(``mlx_lm.tool_parsers.<family>``), with its results: the text between a family's
markers -> ``{"name", "arguments"}``, or a list of them for several calls; ValueError when
the text holds no call. Where a tool's schema types a parameter, the value follows the
type (a string-typed one stays text); the markers are the family's ``tool_call_start``
and ``tool_call_end``. ``compat/module_table.py`` serves one module per family from
these names (``<family>_parse_tool_call``)."""

import ast
import json
import re
import shlex

from ..tool_parsers.call_syntax_families import braced_to_json
from ..tool_parsers.calls import load_json, named_call
from ..tool_parsers.families import FAMILIES
from .tool_call_values import decode_value, one_or_list, parameter_types

# mlx-lm's module names -> (tool_call_start, tool_call_end).
MARKERS = {name: (f.start, f.end) for name, f in FAMILIES.items()}
MARKERS.update({
    "laguna": MARKERS["glm47"],
    "kimi_k3": ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
    "minicpm5": ("<function name=", "</function>"),
    "muse_spark": ("<atem:function_calls>", "</atem:function_calls>"),
})


def _typed(name, pairs, tools, untyped="any"):
    types = parameter_types(name, tools)
    return {"name": name,
            "arguments": {k: decode_value(v, types.get(k), untyped) for k, v in pairs}}


def json_tools_parse_tool_call(text, tools=None):
    """``{"name": ..., "arguments": {...}}``: the JSON object itself."""
    return load_json(text.strip())


_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def glm47_parse_tool_call(text, tools=None):
    """``f<arg_key>a</arg_key><arg_value>v</arg_value>...``, a JSON call, or ``f a=1 b=2``."""
    text = text.strip()
    if text.startswith("{"):
        name, arguments = named_call(load_json(text))
        return _typed(name, [(k, v if isinstance(v, str) else json.dumps(v))
                             for k, v in arguments.items()], tools)
    if "<arg_key>" in text:
        name = text.split("<arg_key>", 1)[0].strip()
        pairs = [(k.strip(), v) for k, v in _GLM_PAIR.findall(text)]
    else:
        try:
            name, *words = shlex.split(text)
        except ValueError:
            raise ValueError(f"not a GLM tool call: {text[:80]!r}") from None
        pairs = [tuple(w.split("=", 1)) for w in words if "=" in w]
    if not name:
        raise ValueError("a GLM tool call starts with the function name")
    return _typed(name, pairs, tools)


_LONGCAT_PAIR = re.compile(r"<longcat_arg_key>(.*?)</longcat_arg_key>\s*"
                           r"<longcat_arg_value>(.*?)</longcat_arg_value>", re.DOTALL)


def longcat_parse_tool_call(text, tools=None):
    """A JSON call (LongCat-Flash) or GLM-style ``longcat_arg`` pairs (later LongCat)."""
    text = text.strip()
    if text.startswith("{"):
        return json_tools_parse_tool_call(text)
    name = text.split("<longcat_arg_key>", 1)[0].strip()
    if not name:
        raise ValueError("a LongCat tool call starts with the function name")
    return _typed(name, [(k.strip(), v) for k, v in _LONGCAT_PAIR.findall(text)], tools)


_QWEN_FUNCTION = re.compile(r"<function=(.*?)(?:</function>|$)", re.DOTALL)
_QWEN_PARAM = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _name_and_rest(tagged):
    """``name>rest`` or, when the model dropped the ``>``, ``name\\nrest``."""
    head, newline, tail = tagged.partition("\n")
    if ">" in head:
        name, _, rest = tagged.partition(">")
        return name.strip(), rest
    return head.strip(), tail if newline else ""


def qwen3_coder_parse_tool_call(text, tools=None):
    """``<function=f><parameter=a>value</parameter></function>`` (Qwen3-Coder): the first
    function of the text; a parameter the tool's schema does not list stays text, one it
    lists without a type decodes only when it is a JSON object or list."""
    functions = _QWEN_FUNCTION.findall(text)
    if not functions:
        raise ValueError("no <function=...> in the tool call")
    name, inner = _name_and_rest(functions[0])
    types = parameter_types(name, tools)
    arguments = {}
    for param in _QWEN_PARAM.findall(inner):
        key, value = _name_and_rest(param)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if value.lower() == "null" or key not in types:  # a parameter the schema lacks: text
            arguments[key] = None if value.lower() == "null" else value
            continue
        kind = types[key]
        kind = "string" if str(kind).lower() in _QWEN_STRING_TYPES else kind
        arguments[key] = decode_value(value, kind, untyped="containers")
    return {"name": name, "arguments": arguments}


_QWEN_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


_MINIMAX_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
_MINIMAX_PARAM = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


def minimax_m2_parse_tool_call(text, tools=None):
    """``<invoke name="f"><parameter name="a">value</parameter></invoke>``, one or more."""
    calls = [_typed(name, [(k, v.strip("\n")) for k, v in _MINIMAX_PARAM.findall(inner)], tools,
                    untyped="none")
             for name, inner in _MINIMAX_INVOKE.findall(text)]
    return one_or_list(calls)


def _braced_calls(text, quote):
    """Every ``call:name{...}`` in ``text`` (several may follow each other), the braces
    matched outside ``quote``-delimited strings."""
    calls, pos = [], 0
    while (start := text.find("call:", pos)) != -1:
        brace = text.find("{", start)
        if brace == -1:
            break
        depth, i, in_string = 0, brace, False
        while i < len(text):
            if text.startswith(quote, i):
                in_string, i = not in_string, i + len(quote)
                continue
            if not in_string and text[i] in "{}":
                depth += 1 if text[i] == "{" else -1
                if depth == 0:
                    break
            i += 1
        if depth:
            raise ValueError("unbalanced braces in the tool call")
        name = text[start + len("call:"):brace].strip()
        calls.append({"name": name, "arguments": braced_to_json(text[brace:i + 1], quote)})
        pos = i + 1
    return one_or_list(calls)


def gemma4_parse_tool_call(text, tools=None):
    """``call:f{city:<|"|>Paris<|"|>,days:3}``, one or more (Gemma 4)."""
    return _braced_calls(text, '<|"|>')


def function_gemma_parse_tool_call(text, tools=None):
    """``call:f{city:<escape>Paris<escape>}`` (FunctionGemma)."""
    return _braced_calls(text, "<escape>")


class _JsonNames(ast.NodeTransformer):
    """``true``/``false``/``null`` (a template's ``tojson`` inside a call) as constants."""

    NAMES = {"true": True, "false": False, "null": None}

    def visit_Name(self, node):
        if node.id in self.NAMES:
            return ast.copy_location(ast.Constant(self.NAMES[node.id]), node)
        return node


def pythonic_parse_tool_call(text, tools=None):
    """``[f(a=1, b="x"), g()]``: a Python list of calls whose keyword arguments are
    literals (JSON's ``true``/``false``/``null`` included)."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError("a pythonic tool call is a list: [name(key=value, ...)]")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError("not a Python list of calls") from None
    calls = []
    for call in tree.elts:
        if not isinstance(call, ast.Call) or call.args:
            raise ValueError("each tool call must be name(keyword=value, ...)")
        name = ast.unparse(call.func)
        try:
            arguments = {k.arg: ast.literal_eval(_JsonNames().visit(k.value))
                         for k in call.keywords}
        except ValueError:
            raise ValueError(f"arguments of {name} must be literals") from None
        calls.append({"name": name, "arguments": arguments})
    return one_or_list(calls)


def _mistral_entry(entry):
    name, arguments = named_call(entry)
    if isinstance(arguments, str):
        arguments = load_json(arguments)
    call = {"name": name, "arguments": arguments}
    if "id" in entry:
        call["id"] = entry["id"]
    return call


_DECODER = json.JSONDecoder()


def mistral_parse_tool_call(text, tools=None):
    """``f[ARGS]{...}`` calls (concatenated, or separated by ``[TOOL_CALLS]``; text after
    the last is ignored) or a JSON list of ``{"name", "arguments"}``."""
    text = text.strip()
    if text.startswith("["):
        try:
            entries = json.loads(text)
        except ValueError:
            entries = None
        if isinstance(entries, list):
            return one_or_list([_mistral_entry(e) for e in entries])
    calls, pos = [], 0
    while (marker := text.find("[ARGS]", pos)) != -1:
        name = text[pos:marker].replace("[TOOL_CALLS]", "").partition("[CALL_ID]")[0].strip()
        if not name:
            raise ValueError("a Mistral tool call needs a name before [ARGS]")
        start = marker + len("[ARGS]")
        start += len(text[start:]) - len(text[start:].lstrip())
        try:
            arguments, pos = _DECODER.raw_decode(text, start)
        except ValueError:
            raise ValueError(f"the arguments of {name} are not JSON") from None
        calls.append({"name": name, "arguments": arguments})
    return one_or_list(calls)


_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)"
                        r"<\|tool_call_end\|>", re.DOTALL)


def kimi_k2_parse_tool_call(text, tools=None):
    """``<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{...}<|tool_call_end|>``:
    always a list, each call with its ``id``."""
    calls = []
    for ident, arguments in _KIMI_CALL.findall(text):
        ident = ident.strip()
        name = ident.split(":")[0].removeprefix("functions.")
        calls.append({"id": ident, "name": name, "arguments": load_json(arguments.strip())})
    if not calls:
        raise ValueError("no <|tool_call_begin|> call in the Kimi tool-call section")
    return calls


laguna_parse_tool_call = glm47_parse_tool_call


# ``<family>_tool_call_start`` / ``<family>_tool_call_end``: the module table's names.
for _family, (_start, _end) in MARKERS.items():
    globals()[f"{_family}_tool_call_start"] = _start
    globals()[f"{_family}_tool_call_end"] = _end
