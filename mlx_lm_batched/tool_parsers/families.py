"""The ten tool-call families, and which one a chat template asks for (mlx-lm's order
of template checks, so both libraries pick the same parser)."""

from dataclasses import dataclass
from typing import Callable, Optional

from .._reasoning_markers import GEMMA4_THOUGHT, SINGLE_TOKEN_THINK
from .call_syntax_families import parse_function_gemma, parse_gemma4, parse_pythonic
from .json_families import parse_json_tools, parse_kimi_k2, parse_mistral
from .markup_families import parse_glm47, parse_longcat, parse_minimax_m2, parse_qwen3_coder
from .streamed_calls import JsonCallStream, KimiCallStream, MistralCallStream
from .streamed_params import (
    LongcatCallStream,
    MinimaxCallStream,
    PythonicCallStream,
    QwenCoderCallStream,
    function_gemma_stream,
    gemma4_stream,
    glm_stream,
)


@dataclass(frozen=True)
class ToolFamily:
    """A family's markers, body parser and streaming reader. ``end == ""``: a call runs
    to the end of the text (or to the next ``start``)."""

    name: str
    start: str
    end: str
    parse: Callable  # body text -> [(name, arguments), ...]; ValueError when not a call
    # first call's index -> a streamed_calls.CallStream of one body (None: calls come whole)
    stream: Optional[Callable] = None


FAMILIES = {f.name: f for f in [
    ToolFamily("json_tools", "<tool_call>", "</tool_call>", parse_json_tools, JsonCallStream),
    ToolFamily("qwen3_coder", "<tool_call>", "</tool_call>", parse_qwen3_coder,
               QwenCoderCallStream),
    ToolFamily("mistral", "[TOOL_CALLS]", "", parse_mistral, MistralCallStream),
    ToolFamily("glm47", "<tool_call>", "</tool_call>", parse_glm47, glm_stream),
    ToolFamily("kimi_k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
               parse_kimi_k2, KimiCallStream),
    ToolFamily("minimax_m2", "<minimax:tool_call>", "</minimax:tool_call>", parse_minimax_m2,
               MinimaxCallStream),
    ToolFamily("gemma4", "<|tool_call>", "<tool_call|>", parse_gemma4, gemma4_stream),
    ToolFamily("function_gemma", "<start_function_call>", "<end_function_call>",
               parse_function_gemma, function_gemma_stream),
    ToolFamily("longcat", "<longcat_tool_call>", "</longcat_tool_call>", parse_longcat,
               LongcatCallStream),
    ToolFamily("pythonic", "<|tool_call_start|>", "<|tool_call_end|>", parse_pythonic,
               PythonicCallStream),
]}

# (test on the template, family), checked in order: the first that holds wins.
_DETECTION = [
    (lambda t: "<minimax:tool_call>" in t, "minimax_m2"),
    (lambda t: "<|tool_call>" in t and "<tool_call|>" in t, "gemma4"),
    (lambda t: "<start_function_call>" in t, "function_gemma"),
    (lambda t: "<longcat_tool_call>" in t, "longcat"),
    (lambda t: "<arg_key>" in t, "glm47"),
    (lambda t: "<|tool_list_start|>" in t or "<|tool_call_start|>" in t, "pythonic"),
    (lambda t: "<tool_call>\\n<function=" in t or "<tool_call>\n<function=" in t, "qwen3_coder"),
    (lambda t: "<|tool_calls_section_begin|>" in t, "kimi_k2"),
    (lambda t: "[TOOL_CALLS]" in t, "mistral"),
    (lambda t: "<tool_call>" in t and "tool_call.name" in t, "json_tools"),
]

# Reasoning markers, looked for in the template (then the vocabulary): the pairs the
# tokenizer wrapper knows too (one list, in ``_reasoning_markers``).
THINK_MARKERS = [*SINGLE_TOKEN_THINK, GEMMA4_THOUGHT]


def get_family(name):
    """The family called ``name``; ValueError listing the known ones otherwise."""
    if name not in FAMILIES:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def detect_family(chat_template):
    """The family a chat template's markup asks for, or None (no tool markup)."""
    if not isinstance(chat_template, str):
        return None
    return next((FAMILIES[name] for test, name in _DETECTION if test(chat_template)), None)


def detect_think_markers(chat_template, vocab=()):
    """``(start, end)`` of the reasoning block the template (or vocabulary) uses, or None."""
    for start, end in THINK_MARKERS:
        if isinstance(chat_template, str) and start in chat_template and end in chat_template:
            return start, end
    for start, end in THINK_MARKERS:
        if start in vocab and end in vocab:
            return start, end
    return None


def tool_markup(chat_template, vocab=()):
    """``(start, end, parse_tool_call)`` of the tool-call family a tokenizer's chat
    template (else its vocabulary: LFM2-style tool tokens) asks for, or None.

    ``parse_tool_call(text, tools=None)`` is mlx-lm's tokenizer ``tool_parser``: the text
    between the markers -> ``{"name", "arguments"}``, or a list of them for several
    calls; ``ValueError`` when the text is not a call.
    """
    family = detect_family(chat_template)
    if family is None and "<|tool_call_start|>" in vocab and "<|tool_call_end|>" in vocab:
        family = FAMILIES["pythonic"]
    if family is None:
        return None

    def parse_tool_call(text, tools=None):
        calls = [{"name": name, "arguments": arguments} for name, arguments in family.parse(text)]
        return calls[0] if len(calls) == 1 else calls

    return family.start, family.end, parse_tool_call
