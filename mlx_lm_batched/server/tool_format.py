"""Which tool-call format the served model uses, decided once at startup.

Three sources, in this order:

- ``--tool-call-parser``: a ``tool_parsers`` family named by the operator;
- the chat template's own markup: the family it asks for (``tool_parsers`` detects it
  as mlx-lm does), or markup no family parses (its calls then stay in the content);
- the generic format, for templates that render nothing for ``tools`` (SmolLM2's):
  as llama.cpp's server does for such templates, the server describes the tools in the
  system prompt itself and asks for calls as JSON in Hermes ``<tool_call>`` blocks, which
  the ``json_tools`` family parses back and ``tool_choice.py``'s grammar constrains
  from the moment a call starts. Past tool calls and tool results in the conversation
  are written the same way, since such a template cannot show them either.
"""

import json
from dataclasses import dataclass
from typing import Any, Optional

from ..tool_parsers import FAMILIES, detect_family, get_family

GENERIC_FAMILY = FAMILIES["json_tools"]

_PROBE_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


@dataclass(frozen=True)
class ToolFormat:
    """``family``: the parser of the model's calls (None: calls stay in the content);
    ``generic``: the server writes tools, calls and results into the prompt itself;
    ``source``: ``"parser"``, ``"template"`` or ``"generic"`` (for the startup log)."""

    family: Any = None
    generic: bool = False
    source: str = "template"

    def describe(self):
        """One line for the startup log."""
        if self.generic:
            return (f"generic (the chat template renders no tools: the server describes them in "
                    f"the system prompt; calls as {self.family.name} JSON blocks, constrained "
                    "once a call starts)")
        if self.source == "parser":
            return f"{self.family.name} (--tool-call-parser)"
        if self.family is None:
            return "the chat template's own markup (no tool_parsers family parses it: calls stay in the content)"
        return f"{self.family.name} (the chat template's markup)"


def template_renders_tools(tokenizer):
    """True when the chat template's output changes with ``tools`` (or cannot be probed)."""
    try:
        plain = tokenizer.apply_chat_template(_PROBE_MESSAGES, tokenize=False,
                                              add_generation_prompt=True)
        shown = tokenizer.apply_chat_template(_PROBE_MESSAGES, tools=_PROBE_TOOLS, tokenize=False,
                                              add_generation_prompt=True)
    except Exception:  # a template that needs other messages: leave tools to it
        return True
    return plain != shown


def resolve_tool_format(tokenizer, parser_name=None):
    """The :class:`ToolFormat` of a model; ValueError when ``parser_name`` names a family
    other than the generic one for a template that renders no tools (nothing would
    teach the model that family's markup)."""
    if not getattr(tokenizer, "has_chat_template", True):
        return ToolFormat(None, False, "template")
    renders = template_renders_tools(tokenizer)
    if parser_name is not None:
        family = get_family(parser_name)
        if not renders and family is not GENERIC_FAMILY:
            raise ValueError(f"--tool-call-parser {parser_name}: this model's chat template renders "
                             "no tools, so the server uses the generic format "
                             f"({GENERIC_FAMILY.name}); leave the option out or name "
                             f"{GENERIC_FAMILY.name}")
        return ToolFormat(family, not renders, "generic" if not renders else "parser")
    if not renders:
        return ToolFormat(GENERIC_FAMILY, True, "generic")
    return ToolFormat(detect_family(getattr(tokenizer, "chat_template", None)), False, "template")


def _call_block(call):
    fn = call.get("function") or {}
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    body = json.dumps({"name": fn.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"{GENERIC_FAMILY.start}\n{body}\n{GENERIC_FAMILY.end}"


def generic_messages(messages, tools: Optional[list]):
    """``messages`` as a template without tool markup can show them: the tools described
    in the system message, assistant tool calls as ``<tool_call>`` blocks in the content,
    tool results as user turns of ``<tool_response>`` blocks (consecutive ones merged)."""
    out, after_result = [], False  # after_result: the last turn is tool results
    for m in messages:
        m = dict(m)
        if m.get("role") == "tool":
            response = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if after_result:
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
            after_result = True
            continue
        if m.get("role") == "assistant" and m.get("tool_calls"):
            blocks = "\n".join(_call_block(c) for c in m.pop("tool_calls"))
            m["content"] = f"{m['content']}\n{blocks}" if m.get("content") else blocks
        out.append(m)
        after_result = False
    if tools:
        described = _INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False)
                                                         for t in tools))
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}"
                      if out[0].get("content") else described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out
