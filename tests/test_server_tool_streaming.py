"""Streamed tool calls arrive while generated: the call's id and name first, then its
arguments in fragments, on chat completions (``delta.tool_calls``), Responses
(``response.function_call_arguments.delta``) and Messages (``input_json_delta``).

The parser is checked on text cut everywhere; the server on real SmolLM2 with a forced
call (``tool_choice`` naming the function, generated through the grammar engine), with
the official ``openai`` and ``anthropic`` clients: the joined fragments parse to the
arguments the same greedy request gets whole.
"""

import json

import anthropic
import openai
import pytest

from conftest import model_dir
from mlx_lm_batched.tool_parsers import ChatOutputParser, get_family
from server_harness import ServerProcess

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"type": "string", "maxLength": 16},
                                         "days": {"type": "integer", "minimum": 1,
                                                  "maximum": 7}}}}
ASK = "What is the weather in Paris for the next 3 days?"
TEXT = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\\"is", '
        '"n": [1, {"a": "}"}]}}\n</tool_call> ok <tool_call>{"name": "bad"</tool_call>'
        '<tool_call>{"name": "t", "arguments": 5}</tool_call>')


def streamed(text, step):
    """``(content, {index: [delta, ...]})`` of ``text`` fed ``step`` characters at a time."""
    parser = ChatOutputParser(get_family("json_tools"), stream_calls=True)
    results = [parser.feed(text[i:i + step]) for i in range(0, len(text), step)]
    results.append(parser.finish())
    calls = {}
    for r in results:
        for delta in r["tool_calls"]:
            calls.setdefault(delta["index"], []).append(delta)
    return "".join(r["content"] for r in results), calls


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(TEXT)])
def test_parser_streams_arguments_in_fragments(step):
    whole = ChatOutputParser(get_family("json_tools")).parse(TEXT)
    content, calls = streamed(TEXT, step)
    # The block that is not a call stays in the answer, as in the whole parse.
    assert content == whole["content"] == 'Let me check. ok <tool_call>{"name": "bad"</tool_call>'
    assert sorted(calls) == [0, 1]
    for index, deltas in calls.items():
        first, expected = deltas[0], whole["tool_calls"][index]
        assert first["id"].startswith("call_") and first["type"] == "function"
        assert first["function"]["name"] == expected["function"]["name"]
        assert all("id" not in d and "name" not in d["function"] for d in deltas[1:])
        joined = "".join(d["function"]["arguments"] for d in deltas)
        assert json.loads(joined) == json.loads(expected["function"]["arguments"])
    if step <= 3:  # fed in small pieces, the arguments come in many fragments
        assert len(calls[0]) > 5


def test_parser_without_streaming_keeps_whole_calls():
    parser = ChatOutputParser(get_family("json_tools"))
    deltas = [d for i in range(0, len(TEXT), 2) for d in parser.feed(TEXT[i:i + 2])["tool_calls"]]
    assert [d["function"]["name"] for d in deltas] == ["get_weather", "t"]


MODEL = str(model_dir("smollm2", dtype="float32"))  # also the served model's name


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(MODEL, "--max-batch", 8)
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)


def test_chat_completions_stream_arguments(oai):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=48,
                  temperature=0, tools=[{"type": "function", "function": WEATHER}],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = oai.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls"
    deltas, finish = [], None
    for chunk in oai.chat.completions.create(stream=True, **kwargs):
        deltas += chunk.choices[0].delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and {d.index for d in deltas} == {0}
    first = deltas[0]
    assert first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather"
    fragments = [d.function.arguments for d in deltas if d.function.arguments]
    assert len(fragments) > 1, fragments
    assert json.loads("".join(fragments)) == json.loads(whole.message.tool_calls[0].function.arguments)


def test_responses_stream_arguments(oai):
    kwargs = dict(model=MODEL, input=ASK, max_output_tokens=48, temperature=0,
                  tools=[{"type": "function", **WEATHER}],
                  tool_choice={"type": "function", "name": "get_weather"})
    whole = oai.responses.create(**kwargs).output[0]
    assert whole.type == "function_call" and whole.name == "get_weather"
    events = list(oai.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(fragments) > 1, kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == "".join(fragments) and done.item_id == added.item.id
    assert kinds.index("response.output_item.added") < kinds.index(
        "response.function_call_arguments.delta") < kinds.index("response.completed")
    final = events[-1].response.output[0]
    assert final.arguments == done.arguments and final.call_id == added.item.call_id
    assert json.loads(done.arguments) == json.loads(whole.arguments)


def test_messages_stream_input_json(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="none", timeout=300, max_retries=0)
    tool = {"name": WEATHER["name"], "description": WEATHER["description"],
            "input_schema": WEATHER["parameters"]}
    kwargs = dict(model=MODEL, max_tokens=48, tools=[tool],  # greedy: the server default
                  tool_choice={"type": "tool", "name": "get_weather"},
                  messages=[{"role": "user", "content": ASK}])
    whole = next(b for b in client.messages.create(**kwargs).content if b.type == "tool_use")
    with client.messages.stream(**kwargs) as s:
        events = list(s)
        final = s.get_final_message()
    start = next(e for e in events if e.type == "content_block_start"
                 and e.content_block.type == "tool_use")
    assert start.content_block.name == "get_weather" and start.content_block.id.startswith("toolu_")
    fragments = [e.delta.partial_json for e in events if e.type == "content_block_delta"
                 and e.delta.type == "input_json_delta"]
    assert len(fragments) > 1, fragments
    call = next(b for b in final.content if b.type == "tool_use")
    assert final.stop_reason == "tool_use" and call.id == start.content_block.id
    assert json.loads("".join(fragments)) == call.input == whole.input
