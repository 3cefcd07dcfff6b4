"""Structured outputs on the server, with the official ``openai`` client: ``response_format``
(json_object, json_schema strict), vLLM's ``guided_*`` fields, forced ``tool_choice``
(whole and streamed),
vLLM's extra sampling fields; constrained and free requests in one batch; bad
constraint fields answered with a 400 naming them."""

import concurrent.futures as futures
import json

import jsonschema
import pytest
from transformers import PreTrainedTokenizerFast

from server_harness import ServerProcess

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pets"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "pets": {"type": "array", "maxItems": 2,
                                  "items": {"enum": ["cat", "dog", "fish"]}}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                   "required": ["zone"], "additionalProperties": False}}}


MODEL = None  # the served model's id (its directory), set by the server fixture


@pytest.fixture(scope="module")
def server(float_dirs):
    global MODEL
    MODEL = str(float_dirs["smollm2"])
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 8)
    yield srv
    srv.stop()


def ask(text):
    return [{"role": "user", "content": text}]


def test_schema_and_free_requests_share_the_batch(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

    def constrained(i):
        r = client.chat.completions.create(model=MODEL, messages=ask(f"Describe person {i}."),
                                           max_tokens=40, response_format=fmt)
        return r.choices[0]

    def free(i):
        return client.chat.completions.create(model=MODEL, messages=ask(f"Count to {i}."),
                                              max_tokens=12).choices[0]

    with futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(constrained, i) for i in range(2)] + [pool.submit(free, i) for i in (3, 5)]
        results = [j.result() for j in jobs]
    for choice in results[:2]:
        assert choice.finish_reason == "stop" and choice.message.refusal is None
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert all(c.message.content for c in results[2:])
    obj = client.chat.completions.create(model=MODEL, messages=ask("Give a JSON object about a cat."),
                                         max_tokens=48, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_guided_fields_on_completions(client):
    r = client.completions.create(model=MODEL, prompt="The date today is", max_tokens=12,
                                  extra_body={"guided_regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"})
    text = r.choices[0].text
    assert len(text) == 10 and text[4] == "-" and text.replace("-", "").isdigit(), text
    r = client.completions.create(model=MODEL, prompt="Pick an animal:", max_tokens=8,
                                  extra_body={"guided_grammar": 'start: " cat" | " dog"'})
    assert r.choices[0].text in (" cat", " dog")
    r = client.completions.create(model=MODEL, prompt="Person:", max_tokens=40,
                                  extra_body={"response_format": {
                                      "type": "json_schema",
                                      "json_schema": {"name": "p", "schema": PERSON}}})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)


@pytest.mark.parametrize("choice,name", [("required", None),
                                         ({"type": "function", "function": {"name": "get_time"}},
                                          "get_time")])
def test_forced_tool_choice(client, choice, name):
    r = client.chat.completions.create(model=MODEL, messages=ask("What is the weather in Paris?"),
                                       tools=[WEATHER, TIME], tool_choice=choice, max_tokens=48)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    call = c.message.tool_calls[0]
    assert call.function.name in ({"get_weather", "get_time"} if name is None else {name})
    schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)



def test_forced_tool_choice_streamed(client):
    """Streamed, a forced named call arrives as OpenAI tool-call deltas (name first,
    arguments in pieces) that add up to the call the same greedy request gets whole
    (``required`` takes the same path; the whole-response test above covers both forms)."""
    kwargs = dict(model=MODEL, messages=ask("What is the weather in Paris?"), tools=[WEATHER, TIME],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  max_tokens=48, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or d.id
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls" and "<tool_call>" not in content
    assert list(calls) == [0] and calls[0]["id"].startswith("call_")
    call = calls[0]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
    assert (call["name"], json.loads(call["arguments"])) == (whole.function.name,
                                                             json.loads(whole.function.arguments))

def test_vllm_sampling_fields(client, float_dirs):
    base = dict(model=MODEL, prompt="Hello", max_tokens=16)
    free = client.completions.create(**base, logprobs=0)
    assert free.usage.completion_tokens >= 3
    # ignore_eos: every one of max_tokens tokens is generated.
    r = client.completions.create(**{**base, "max_tokens": 24}, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"
    # stop_token_ids: the first token of the free run ends the row there.
    tok = PreTrainedTokenizerFast(tokenizer_file=str(float_dirs["smollm2"] / "tokenizer.json"))
    first = tok.encode(free.choices[0].text, add_special_tokens=False)[0]
    r = client.completions.create(**base, extra_body={"stop_token_ids": [first]})
    assert r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    r = client.completions.create(**base, extra_body={"min_tokens": 10, "ignore_eos": False})
    assert r.usage.completion_tokens >= 10


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "bogus"}}}}, "response_format"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ("/v1/completions", {"guided_regex": "("}, "guided_regex"),
    ("/v1/completions", {"guided_regex": "a", "response_format": {"type": "json_object"}},
     "guided_regex"),
    ("/v1/completions", {"stop_token_ids": [10 ** 9]}, "stop_token_ids"),
    ("/v1/completions", {"min_tokens": -1}, "min_tokens"),
    ("/v1/completions", {"skip_special_tokens": "no"}, "skip_special_tokens"),
    ("/v1/chat/completions", {"echo": True}, "echo"),
])
def test_bad_constraint_fields(server, path, body, param):
    base = {"messages": ask("Hi")} if "chat" in path else {"prompt": "Hi"}
    code, got, _ = server.post(path, {**base, **body, "max_tokens": 4})
    assert code == 400, got
    assert set(got["error"]) == {"message", "type", "param", "code"}
    assert got["error"]["param"] == param, got
    assert server.get("/health")[0] == 200


def test_tokenize_and_detokenize(server, float_dirs):
    tok = PreTrainedTokenizerFast(tokenizer_file=str(float_dirs["smollm2"] / "tokenizer.json"))
    code, body, _ = server.post("/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    assert code == 200, body
    assert body["tokens"] == tok.encode("Hello world") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 8192 and body["token_strs"][-1] == "Ġworld"
    code, chat, _ = server.post("/tokenize", {"messages": ask("Hi")})
    assert code == 200 and chat["count"] > body["count"]
    code, back, _ = server.post("/detokenize", {"tokens": body["tokens"]})
    assert code == 200 and back == {"prompt": "Hello world"}
    code, err, _ = server.post("/detokenize", {"tokens": [10 ** 9]})
    assert code == 400 and err["error"]["param"] == "tokens"
    code, err, _ = server.post("/v1/nowhere", {})
    assert code == 404 and set(err["error"]) == {"message", "type", "param", "code"}


def test_anthropic_messages(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="none")
    msg = client.messages.create(model=MODEL, max_tokens=12, system="You are terse.",
                                 messages=[{"role": "user", "content": "Name a color."}])
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens <= 12
    with client.messages.stream(model=MODEL, max_tokens=12, system="You are terse.",
                                messages=[{"role": "user", "content": "Name a color."}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == msg.content[0].text == final.content[0].text
    tool = {"name": "get_weather", "description": "Weather of a city",
            "input_schema": WEATHER["function"]["parameters"]}
    used = client.messages.create(
        model=MODEL, max_tokens=48, tools=[tool], tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Oslo?"}])
    call = next(b for b in used.content if b.type == "tool_use")
    assert used.stop_reason == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, tool["input_schema"])
    # The tool's result goes back as a tool_result block; the model answers in text.
    again = client.messages.create(
        model=MODEL, max_tokens=12, tools=[tool],
        messages=[{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": call.id,
                                                     "name": call.name, "input": call.input}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                "content": "Sunny, 20 C"}]}])
    assert again.content and again.usage.input_tokens > used.usage.input_tokens


def test_openai_responses(client, server):
    r = client.responses.create(model=MODEL, input="Name a color.", instructions="Be terse.",
                                max_output_tokens=12)
    assert r.object == "response" and r.output_text and r.usage.output_tokens <= 12
    with client.responses.stream(model=MODEL, input="Name a color.", instructions="Be terse.",
                                 max_output_tokens=12) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert deltas == final.output_text == r.output_text
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    j = client.responses.create(model=MODEL, input="Describe a person.", max_output_tokens=40,
                                text={"format": fmt})
    jsonschema.validate(json.loads(j.output_text), PERSON)
    tool = {"type": "function", **WEATHER["function"]}
    call = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[tool],
                                   tool_choice="required", max_output_tokens=48).output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    follow = client.responses.create(model=MODEL, max_output_tokens=8, tools=[tool], input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    assert follow.output_text
    code, err, _ = server.post("/v1/responses", {"input": "x", "previous_response_id": "resp_1"})
    assert code == 400 and err["error"]["param"] == "previous_response_id"
