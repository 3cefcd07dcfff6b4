"""Tool-call and reasoning parsing per model family (text processing only: this
package imports nothing else of mlx_lm_batched).

``select_family(chat_template, name=None)`` picks one of the ten families the way
mlx-lm does (or the one named); :class:`ChatOutputParser` splits streamed or whole
output into answer, reasoning and OpenAI tool calls (streamed, each family's calls open
with their name and send their arguments as JSON fragments while generated:
``streamed_calls``, ``streamed_params``); :class:`TextStateMachine` is
mlx-lm's marker-driven text splitter under its name."""

from .families import (
    FAMILIES,
    ToolFamily,
    detect_family,
    detect_think_markers,
    get_family,
    tool_markup,
)
from .chat_output import ChatOutputParser
from .state_machine import TextStateMachine, make_text_state_machine


def select_family(chat_template, name=None):
    """The family called ``name`` (ValueError when unknown), else the template's."""
    return get_family(name) if name is not None else detect_family(chat_template)


__all__ = ["FAMILIES", "ChatOutputParser", "TextStateMachine", "ToolFamily", "detect_family",
           "detect_think_markers", "get_family", "make_text_state_machine", "select_family",
           "tool_markup"]
