"""Every response body the server sends, checked against OpenAI's published OpenAPI schemas.

``tests/data/openai_schemas.json`` holds the schemas of OpenAI's ``openapi.json`` this test
needs (chat and text completions, stream chunks, models, errors), ``$ref``s resolved; it
names the commit it came from (``scripts/vendor_openai_schemas.py`` rebuilds it).

Two places where OpenAI's own API departs from its document are allowed here, and only
there: a text-completion stream chunk has ``finish_reason: null`` until its last chunk
(the document gives streamed and whole completions one schema, whose ``finish_reason`` is a
string), and an echoed prompt's first token has ``null`` for its logprob and top
alternatives (the legacy API's and vLLM's answer; the document lists numbers only).
"""

import copy
import json
import urllib.request

import pytest
from jsonschema import Draft202012Validator

from server_harness import ServerProcess

with open(__file__.rsplit("/", 1)[0] + "/data/openai_schemas.json") as f:
    SCHEMAS = json.load(f)["schemas"]
MODEL = None  # the served model's id (its directory), set by the server fixture
ASK = [{"role": "user", "content": "Name a colour."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "additionalProperties": False,
                                          "properties": {"city": {"enum": ["Paris", "Rome"]}},
                                          "required": ["city"]}}}


def completion_schema(stream=False, echo=False):
    """``CreateCompletionResponse`` with the two documented allowances (module docstring)."""
    schema = copy.deepcopy(SCHEMAS["CreateCompletionResponse"])
    choice = schema["properties"]["choices"]["items"]["properties"]
    if stream:
        choice["finish_reason"] = {"anyOf": [choice["finish_reason"], {"type": "null"}]}
    if echo:
        lp = choice["logprobs"]["anyOf"][0]["properties"]
        for key in ("token_logprobs", "top_logprobs"):
            lp[key]["items"] = {"anyOf": [lp[key]["items"], {"type": "null"}]}
    return schema


def check(schema, body):
    errors = sorted(Draft202012Validator(schema).iter_errors(body), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message[:300]}" for e in errors[:5])


@pytest.fixture(scope="module")
def server(float_dirs):
    global MODEL
    MODEL = str(float_dirs["smollm2"])
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 8)
    yield srv
    srv.stop()


def events(server, path, body):
    """The JSON objects of a server-sent event stream, up to ``[DONE]``."""
    req = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                return out
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    raise AssertionError(f"stream ended without [DONE]: {out}")


def test_chat_responses(client, server):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=6, logprobs=True, top_logprobs=2, n=2)
    body = json.loads(raw.http_response.text)
    check(SCHEMAS["CreateChatCompletionResponse"], body)
    assert body["choices"][0]["message"]["refusal"] is None
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=40, tools=[WEATHER], tool_choice="required")
    body = json.loads(raw.http_response.text)
    check(SCHEMAS["CreateChatCompletionResponse"], body)
    assert body["choices"][0]["message"]["tool_calls"], body
    chunks = events(server, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 6, "logprobs": True, "top_logprobs": 1,
        "stream_options": {"include_usage": True}})
    for chunk in chunks:
        check(SCHEMAS["CreateChatCompletionStreamResponse"], chunk)
    assert chunks[-1]["usage"]["completion_tokens"] == 6 and chunks[-1]["choices"] == []


def test_completion_responses(client, server):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=["Hi", "Red, green,"],
                                                      max_tokens=4, logprobs=2)
    check(completion_schema(), json.loads(raw.http_response.text))
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="Red, green,",
                                                      max_tokens=2, logprobs=1, echo=True)
    body = json.loads(raw.http_response.text)
    check(completion_schema(echo=True), body)
    with pytest.raises(AssertionError):  # the allowance is needed, and only there
        check(completion_schema(), body)
    chunks = events(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "logprobs": 1,
                                                "stream_options": {"include_usage": True}})
    for chunk in chunks:
        check(completion_schema(stream=True), chunk)
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_models(client):
    body = json.loads(client.models.with_raw_response.list().http_response.text)
    check(SCHEMAS["ListModelsResponse"], body)
    assert body["data"][0]["id"] == MODEL


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/v1/chat/completions", {"messages": "hi"}, 400),
    ("POST", "/v1/chat/completions", b"{not json", 400),
    ("POST", "/v1/completions", {"prompt": "Hi", "logprobs": 50}, 400),
    ("POST", "/v1/completions", {"prompt": "Hi", "model": "no-such-model"}, 404),
    ("GET", "/v1/nowhere", None, 404),
    ("POST", "/v1/nowhere", {}, 404),
    ("GET", "/v1/chat/completions", None, 405),
])
def test_errors(server, method, path, body, status):
    code, got, _ = server.request(method, path, body)
    assert code == status, got
    check(SCHEMAS["ErrorResponse"], got)
