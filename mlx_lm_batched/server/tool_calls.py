"""The chat-output seam: how one chat request's text becomes ``content``,
``reasoning_content`` and ``tool_calls``.

:func:`chat_output` decides, once per request, the tool-call family (the server's
``--tool-call-parser``, else the one the chat template asks for; see
``tool_parsers``), the reasoning markers, whether the prompt already opened the
reasoning block, and what ``tool_choice`` allows. The handlers only call
``ChatOutput.parser()`` per choice and feed it text. Forced tool calls
(``tool_choice`` ``required`` or a named function) are constrained to the
``json_tools`` (Hermes/Qwen) format by ``tool_choice.py``'s grammar: a model whose
template asks for another format is refused for them (a 400 naming it), one whose
template has no tool markup uses the generic format (``tool_format.py``), which is it.
"""

import json
from dataclasses import dataclass
from typing import Any, Optional

from ..tokenization.tokenizer import TokenizerWrapper
from ..tool_parsers import FAMILIES, ChatOutputParser, detect_think_markers, select_family
from .errors import APIError

# The format forced tool calls take (``tool_choice.py``'s grammar).
FORCED_FAMILY = FAMILIES["json_tools"]
OPEN, CLOSE = FORCED_FAMILY.start, FORCED_FAMILY.end


@dataclass
class ChatOutput:
    """Per-request parsing settings; ``tools_for_template``: the tools the template sees."""

    family: Any = None  # a tool_parsers.ToolFamily, or None: tool markup is plain text
    think: Optional[tuple] = None
    in_reasoning: bool = False
    tools_for_template: Optional[list] = None

    def parser(self, stream_calls=False):
        """A fresh parser for one choice; ``stream_calls``: tool calls come as they are
        generated, their arguments in fragments (every family; see ``tool_parsers``)."""
        return ChatOutputParser(self.family, self.think, self.in_reasoning, stream_calls)


def forces_tool_call(tool_choice):
    """True for ``tool_choice`` ``"required"`` or a named function."""
    return tool_choice == "required" or (isinstance(tool_choice, dict)
                                         and tool_choice.get("type") == "function")


def check_tool_choice(tool_choice, tools):
    """The tools to show the template: all of them for ``auto`` and the forced forms,
    none for ``none``; APIError(400) for a ``tool_choice`` outside OpenAI's schema."""
    if tool_choice is None or tool_choice == "auto" or forces_tool_call(tool_choice):
        if forces_tool_call(tool_choice) and not tools:
            raise APIError(400, "'tool_choice' forces a tool call but 'tools' is empty.",
                           "tool_choice", "invalid_value")
        return tools or None
    if tool_choice == "none":
        return None
    raise APIError(400, "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}.", "tool_choice",
                   "invalid_value")


def chat_output(tokenizer, messages, tools, tool_choice, template_kwargs, parser_name=None,
                tool_format=None):
    """The :class:`ChatOutput` of one chat request (see the module docstring);
    ``tool_format`` (``tool_format.ToolFormat``, decided at startup) names the family,
    else ``parser_name`` or the template do."""
    tools = check_tool_choice(tool_choice, tools)
    template = getattr(tokenizer, "chat_template", None)
    if not tools:
        family = None
    elif tool_format is not None:
        family = tool_format.family
    else:
        family = select_family(template, parser_name)
    if forces_tool_call(tool_choice):
        if family is None:
            family = FORCED_FAMILY
        elif family is not FORCED_FAMILY:
            raise APIError(400, f"'tool_choice' {json.dumps(tool_choice)[:60]} forces a call in "
                           f"the {FORCED_FAMILY.name} format; this model's tool calls use "
                           f"{family.name} (use 'auto').", "tool_choice", "unsupported_value")
    think = detect_think_markers(template, _vocab(tokenizer))
    in_reasoning = False
    if think is not None:
        try:
            rendered = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                     add_generation_prompt=True, **template_kwargs)
        except Exception:  # the engine renders again and reports the template's error
            rendered = ""
        tail = rendered.rstrip()
        in_reasoning = tail.endswith(think[0])
    return ChatOutput(family, think, in_reasoning, tools)


def split_tool_calls(text, family=FORCED_FAMILY):
    """``(content, [OpenAI tool calls])`` of a whole text in ``family``'s format (blocks
    that do not parse stay in the content as written; no family: all of it is content)."""
    if family is None:
        return text, []
    parsed = ChatOutputParser(family, None, False).parse(text)
    return parsed["content"], parsed["tool_calls"]


def answer_family(tools, tool_choice, tool_format):
    """The tool-call family of a Responses or Messages answer: None without ``tools``;
    the forced format for a forced call (``tool_choice.py``'s grammar writes it) or when
    no family parses the model's markup; else the model's (``tool_format``, decided at
    startup), as on chat completions."""
    if not tools:
        return None
    if forces_tool_call(tool_choice) or tool_format is None or tool_format.family is None:
        return FORCED_FAMILY
    return tool_format.family


def answer_parser(family):
    """The streaming parser of a Responses or Messages answer: calls in ``family``'s
    format (see :func:`answer_family`; as :func:`split_tool_calls` reads them whole)
    come as they are generated, their arguments in fragments; without one, all text is
    content."""
    return ChatOutputParser(family, None, False, stream_calls=True)


def _vocab(tokenizer):
    try:
        # The wrapper's vocabulary is read once per model; a listing per request would
        # cost ~0.24 s each on Gemma 3 (262144 tokens).
        if isinstance(tokenizer, TokenizerWrapper):
            return tokenizer.vocab
        return tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary listing: the template decides
        return {}


def message_fields(parsed):
    """The assistant message's fields from a whole parse (``reasoning`` mirrors
    ``reasoning_content``: clients read either)."""
    content, calls = parsed["content"], parsed["tool_calls"]
    message = {"role": "assistant", "content": content if content or not calls else None,
               "refusal": None}  # OpenAI's schema requires the key
    if parsed["reasoning_content"]:
        message["reasoning_content"] = message["reasoning"] = parsed["reasoning_content"]
    if calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
    return message


def delta_fields(parsed):
    """A streamed delta's fields from one ``feed``/``finish`` result."""
    delta = {}
    if parsed["reasoning_content"]:
        delta["reasoning_content"] = delta["reasoning"] = parsed["reasoning_content"]
    if parsed["content"]:
        delta["content"] = parsed["content"]
    if parsed["tool_calls"]:
        delta["tool_calls"] = parsed["tool_calls"]
    return delta
