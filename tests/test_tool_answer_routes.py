"""The Responses and Messages routes read tool calls in the served model's family (the
one chat completions uses), whole and streamed, and force the ``json_tools`` format
only where the grammar writes it.

The model's output is the assistant turn each real chat template renders (as in
test_tool_parsers); the routes' own event writers turn it into SSE events, fed a few
characters per generated piece as the engine would send them.
"""

import asyncio
import json

import pytest

from mlx_lm_batched.server import anthropic_messages, openai_responses
from mlx_lm_batched.server.events import Delta, Finished, Started
from mlx_lm_batched.server.tool_calls import answer_family
from mlx_lm_batched.server.tool_format import ToolFormat
from mlx_lm_batched.tool_parsers import FAMILIES, get_family
from test_tool_parsers import CALLS, TEMPLATES, model_output

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


class _Job:
    """What the routes' event writers read of a job: its start and its events."""

    def __init__(self, text, step=3):
        self.started = Started(prompt_tokens=5, cached_tokens=0)
        self._events = [Delta(0, text[i:i + step], []) for i in range(0, len(text), step)]
        self._events.append(Finished(0, "stop", len(self._events)))

    async def events(self):
        for ev in self._events:
            yield ev


def sse_events(generator):
    async def collect():
        return [chunk async for chunk in generator]
    out = []
    for chunk in asyncio.run(collect()):
        data = next(line for line in chunk.splitlines() if line.startswith("data: "))
        out.append(json.loads(data[len("data: "):]))
    return out


def test_the_answer_family_is_the_models_unless_a_call_is_forced():
    qwen = ToolFormat(get_family("qwen3_coder"), False, "template")
    assert answer_family(TOOLS, "auto", qwen).name == "qwen3_coder"
    assert answer_family(TOOLS, None, qwen).name == "qwen3_coder"
    assert answer_family(TOOLS, FORCED, qwen).name == "json_tools"
    assert answer_family(TOOLS, "required", qwen).name == "json_tools"
    assert answer_family(TOOLS, "auto", ToolFormat(None)).name == "json_tools"
    assert answer_family(None, "auto", qwen) is None


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_responses_and_messages_stream_each_familys_calls(name):
    _, text = model_output(name, (TEMPLATES / f"{name}.jinja").read_text())
    family = get_family(name)
    # Responses: each call an output item whose argument deltas join to its arguments.
    head = {"id": "resp_x", "object": "response"}
    events = sse_events(openai_responses._events(_Job(text), head, family))
    calls = [e["item"] for e in events if e["type"] == "response.output_item.done"
             and e["item"]["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == CALLS, name
    for call in calls:
        deltas = [e["delta"] for e in events if e.get("item_id") == call["id"]
                  and e["type"] == "response.function_call_arguments.delta"]
        assert len(deltas) > 1 and "".join(deltas) == call["arguments"], (name, deltas)
    whole = [i for i in openai_responses._output(text, family) if i["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in whole] == CALLS
    # Messages: tool_use blocks whose input_json_delta fragments join to the input.
    events = sse_events(anthropic_messages._events(_Job(text), {"id": "msg_x"}, family))
    starts = [e for e in events if e["type"] == "content_block_start"
              and e["content_block"]["type"] == "tool_use"]
    assert [s["content_block"]["name"] for s in starts] == [n for n, _ in CALLS]
    for start, (_, arguments) in zip(starts, CALLS):
        parts = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
                 and e["index"] == start["index"] and e["delta"]["type"] == "input_json_delta"]
        assert len(parts) > 1 and json.loads("".join(parts)) == arguments, (name, parts)
    stop = next(e for e in events if e["type"] == "message_delta")
    assert stop["delta"]["stop_reason"] == "tool_use"
    blocks, called = anthropic_messages._blocks(text, family)
    assert called and [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"] == CALLS


def test_without_tools_the_answer_is_all_text():
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    events = sse_events(openai_responses._events(_Job(text), {"id": "r"}, None))
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["message"] and done[0]["content"][0]["text"] == text
    assert anthropic_messages._blocks(text, None) == ([{"type": "text", "text": text}], False)
