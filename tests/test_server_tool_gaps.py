"""Free (``tool_choice`` auto) streamed tool calls on every endpoint, Messages'
``tool_choice {"type": "any"}`` and ``disable_parallel_tool_use``, and docs/server.md's
table of tool-call formats per model family checked against the code that resolves them.

The server runs SmolLM2 float32 (generic format); the few-shot conversation makes the
model call ``get_weather`` by itself, so the call under ``auto`` is certain.
"""

import json
import re
from pathlib import Path

import anthropic
import jsonschema
import pytest
from transformers import AutoTokenizer

from mlx_lm_batched.server.tool_format import resolve_tool_format
from server_harness import ServerProcess

WEATHER = {"name": "get_weather", "description": "Get the current weather of a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"enum": ["paris", "rome", "berlin"]}}}}
TIME = {"name": "get_time", "description": "Time in a zone",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"],
                       "properties": {"zone": {"enum": ["UTC", "CET"]}}}}
SCHEMAS = {t["name"]: t["parameters"] for t in (WEATHER, TIME)}
MODEL = None  # the served model's id (its directory), set by the server fixture


def _arguments(city):
    return json.dumps({"city": city})


# Two earlier turns that called the tool: SmolLM2-135M then calls it by itself.
ASKS = ["Weather in Paris?", "Weather in Rome?", "Weather in Berlin?"]
CITIES = ["Paris", "Rome"]
CHAT_FEW_SHOT = [m for i, city in enumerate(CITIES) for m in (
    {"role": "user", "content": ASKS[i]},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{i}", "type": "function",
        "function": {"name": "get_weather", "arguments": _arguments(city)}}]})] + [
    {"role": "user", "content": ASKS[2]}]
RESPONSES_FEW_SHOT = [m for i, city in enumerate(CITIES) for m in (
    {"role": "user", "content": ASKS[i]},
    {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
     "arguments": _arguments(city)})] + [{"role": "user", "content": ASKS[2]}]
MESSAGES_FEW_SHOT = [m for i, city in enumerate(CITIES) for m in (
    {"role": "user", "content": ASKS[i]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}",
                                        "name": "get_weather", "input": {"city": city}}]})] + [
    {"role": "user", "content": ASKS[2]}]
CLAUDE_TOOLS = [{"name": t["name"], "description": t["description"],
                 "input_schema": t["parameters"]} for t in (WEATHER, TIME)]


@pytest.fixture(scope="module")
def server(float_dirs):
    global MODEL
    MODEL = str(float_dirs["smollm2"])
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 8)
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", timeout=300, max_retries=0)


def test_chat_free_call_streams_arguments_in_fragments(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHAT_FEW_SHOT, max_tokens=40, stream=True,
        tools=[{"type": "function", "function": WEATHER}]))
    deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas if d.function.name] == ["get_weather"]
    fragments = [d.function.arguments for d in deltas if d.function.arguments]
    assert len(fragments) > 1, fragments
    assert json.loads("".join(fragments)) == {"city": "berlin"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_responses_free_call_streams_arguments_in_fragments(client):
    events = list(client.responses.create(model=MODEL, input=RESPONSES_FEW_SHOT, stream=True,
                                          tools=[{"type": "function", **WEATHER}],
                                          max_output_tokens=40))
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added"
                 and e.item.type == "function_call")
    assert added.item.name == "get_weather"
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(fragments) > 1, kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == "".join(fragments) and done.item_id == added.item.id
    jsonschema.validate(json.loads(done.arguments), WEATHER["parameters"])
    assert json.loads(done.arguments) == {"city": "berlin"}
    [final] = [i for i in events[-1].response.output if i.type == "function_call"]
    assert final.arguments == done.arguments and final.call_id == added.item.call_id


def test_messages_free_call_streams_input_json(claude):
    with claude.messages.stream(model=MODEL, max_tokens=40, messages=MESSAGES_FEW_SHOT,
                                tools=CLAUDE_TOOLS[:1]) as s:
        events = list(s)
        final = s.get_final_message()
    start = next(e for e in events if e.type == "content_block_start"
                 and e.content_block.type == "tool_use")
    assert start.content_block.name == "get_weather"
    fragments = [e.delta.partial_json for e in events if e.type == "content_block_delta"
                 and e.delta.type == "input_json_delta"]
    assert len(fragments) > 1, fragments
    joined = json.loads("".join(fragments))
    jsonschema.validate(joined, WEATHER["parameters"])
    [use] = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and use.input == joined == {"city": "berlin"}


def _tool_uses(message):
    uses = [b for b in message.content if b.type == "tool_use"]
    for use in uses:
        jsonschema.validate(use.input, SCHEMAS[use.name])
    return uses


@pytest.mark.parametrize("disable_parallel", [None, False, True])
def test_messages_tool_choice_any(claude, disable_parallel):
    """``any`` forces a call with no few-shot turns at all; ``disable_parallel_tool_use``
    allows exactly one, otherwise one or more (SmolLM2 asks for both here)."""
    choice = {"type": "any"}
    if disable_parallel is not None:
        choice["disable_parallel_tool_use"] = disable_parallel
    msg = claude.messages.create(model=MODEL, max_tokens=120, tools=CLAUDE_TOOLS,
                                 tool_choice=choice, messages=[{
                                     "role": "user",
                                     "content": "Weather in Paris and the time in UTC?"}])
    uses = _tool_uses(msg)
    assert msg.stop_reason == "tool_use" and not [b for b in msg.content if b.type == "text"], msg
    if disable_parallel:
        assert len(uses) == 1, msg
    else:
        assert len(uses) >= 1, msg
        assert {u.name for u in uses} == {"get_weather", "get_time"}, msg


def test_messages_auto_answers_without_forcing(claude):
    """The contrast to ``any``: the same question under ``auto`` is answered in text."""
    msg = claude.messages.create(model=MODEL, max_tokens=20, tools=CLAUDE_TOOLS,
                                 tool_choice={"type": "auto"},
                                 messages=[{"role": "user", "content": "Say hello."}])
    assert msg.stop_reason in ("end_turn", "max_tokens") and not _tool_uses(msg), msg


# --- docs/server.md's table of tool-call formats ---------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "server.md"
TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
# Llama 3.1's tool rendering, reduced (no Llama checkpoint is stored): the tools as JSON
# in the user turn and calls as bare JSON, which no tool_parsers family parses.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- if tools is not none %}<|start_header_id|>system<|end_header_id|>\n\n"
    "Environment: ipython<|eot_id|>{%- endif %}"
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{%- if tools is not none and loop.last %}Given the following functions, respond with a JSON "
    "for a function call with its proper arguments.\nRespond in the format {\"name\": function "
    "name, \"parameters\": dictionary of argument name and its value}.\n"
    "{%- for t in tools %}{{ t | tojson(indent=4) }}\n\n{%- endfor %}{%- endif %}"
    "{{ m.content }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}")
# Each row of the table: the chat template standing for that family (None: SmolLM2's own).
ROW_TEMPLATES = {
    "Qwen 2.5 / Qwen3, Hermes fine-tunes": "json_tools",
    "Qwen3-Coder": "qwen3_coder",
    "Mistral v11+, Mistral Small 3.x, Devstral": "mistral",
    "GLM-4.5 / 4.6 / 4.7": "glm47",
    "Kimi K2": "kimi_k2",
    "MiniMax M2": "minimax_m2",
    "Gemma 4": "gemma4",
    "FunctionGemma": "function_gemma",
    "LFM2 (Liquid)": "pythonic",
    "LongCat (its template shows no tools)": "longcat",
    "Llama 3.x (shows tools, no parser family)": LLAMA3_TEMPLATE,
    "SmolLM2 and any template that shows no tools": None,
}


def _format_table():
    """``{family cell: format cell}`` of the table under its heading."""
    section = DOC.read_text().split("## Tool-call formats by model family", 1)[1]
    rows = {}
    for line in section.split("\n\n", 2)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and not set(cells[1]) <= set("-") and cells[0] != "Model family (chat template)":
            rows[cells[0]] = cells[1]
    return rows


def _described(fmt):
    """How the table writes a resolved :class:`ToolFormat`."""
    if fmt.generic:
        return "generic"
    if fmt.family is None:
        return "the template's own markup, not parsed"
    return fmt.family.name


def _expected(cell):
    if cell.startswith("generic"):
        return "generic"
    if cell.startswith("the template's own markup"):
        return "the template's own markup, not parsed"
    return re.match(r"`(\w+)`", cell).group(1)


def test_docs_format_table_matches_the_resolver(float_dirs):
    rows = _format_table()
    assert sorted(rows) == sorted(ROW_TEMPLATES)
    for row, cell in rows.items():
        tokenizer = AutoTokenizer.from_pretrained(str(float_dirs["smollm2"]))
        source = ROW_TEMPLATES[row]
        if source is not None:
            tokenizer.chat_template = (source if "{" in source
                                       else (TEMPLATES / f"{source}.jinja").read_text())
        assert _described(resolve_tool_format(tokenizer)) == _expected(cell), row
