"""A request's output constraint: OpenAI's ``response_format``, vLLM's ``guided_*`` fields
and ``tool_choice``'s forced forms, checked and compiled to one grammar (or None).

The grammar engine (``sampling/grammar.py``) compiles them; a field it cannot honour is
a 400 naming it, never silently ignored.
"""

import json

from ..sampling.grammar import grammar_spec
from .errors import APIError
from .tool_choice import tool_choice_grammar

# vLLM's names for the grammar fields (SGLang's ``regex`` / ``ebnf`` mean the same).
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_grammar")


def request_constraint(req, tool_format=None):
    """The llguidance grammar of ``req``'s constraint fields, or None; APIError(400).

    ``tool_format`` (``tool_format.ToolFormat``): with the generic format, ``tool_choice``
    ``"auto"`` constrains calls once they start, unless another field constrains the
    output (a call cannot start inside it)."""
    given = [f for f in ("response_format", *GUIDED_FIELDS) if getattr(req, f, None) is not None]
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.get("type") == "text":
        given.remove("response_format")
    choice = getattr(req, "tool_choice", None)
    lazy = bool(tool_format is not None and tool_format.generic and not given)
    tool_grammar = tool_choice_grammar(getattr(req, "tools", None), choice,
                                       getattr(req, "parallel_tool_calls", True) is not False, lazy)
    if tool_grammar is not None and not (lazy and choice in (None, "auto")):
        given.append("tool_choice")
    if len(given) > 1:
        raise APIError(400, f"Only one output constraint per request; got {', '.join(given)}.",
                       given[1], "invalid_value")
    if tool_grammar is not None:
        return _compiled(lambda: grammar_spec(grammar=tool_grammar), "tool_choice")
    if "guided_json" in given:
        schema = req.guided_json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise APIError(400, "Invalid value for 'guided_json': not valid JSON.",
                               "guided_json", "invalid_value") from None
        rf = {"type": "json_schema", "json_schema": {"schema": schema}}
        return _compiled(lambda: grammar_spec(response_format=rf), "guided_json")
    if "guided_regex" in given:
        return _compiled(lambda: grammar_spec(regex=req.guided_regex), "guided_regex")
    if "guided_grammar" in given:
        return _compiled(lambda: grammar_spec(grammar=req.guided_grammar), "guided_grammar")
    if rf is not None:
        return _compiled(lambda: grammar_spec(response_format=rf), "response_format")
    return None


def _compiled(compile_, field):
    try:
        return compile_()
    except (ValueError, TypeError) as e:
        message = str(e).split(": ", 1)[-1] if str(e).startswith(("response_format", "regex",
                                                                  "grammar")) else str(e)
        raise APIError(400, f"Invalid value for '{field}': {message}", field,
                       "invalid_value") from None
