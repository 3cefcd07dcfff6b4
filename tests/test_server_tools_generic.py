"""Tools for a model whose chat template has no tool markup (SmolLM2), through the
official clients: the generic tool format (tools described in the system prompt, calls
as JSON in ``<tool_call>`` blocks, constrained by the grammar engine once a call starts),
parsed back into chat ``tool_calls``, Responses ``function_call`` items and Messages
``tool_use`` blocks; ``tool_choice: "required"`` with and without parallel calls."""

import json

import jsonschema
import numpy as np
import pytest

from mlx_lm_batched import load
from mlx_lm_batched.sampling.grammar import GrammarProcessor, grammar_spec
from mlx_lm_batched.server.tool_choice import tool_choice_grammar
from mlx_lm_batched.server.tool_format import generic_messages, resolve_tool_format
from server_harness import ServerProcess

# Lower-case city names only: SmolLM2 writes "Berlin" unconstrained (checked below), so
# "berlin" in a call shows the grammar held the call to the schema.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["paris", "rome", "berlin"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                   "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
MODEL = None  # the served model's id (its directory), set by the server fixture


def _call(city, i):
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{i}", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}


# Two earlier turns that called the tool: SmolLM2-135M then calls it by itself.
FEW_SHOT = [{"role": "user", "content": "Weather in Paris?"}, _call("Paris", 1),
            {"role": "user", "content": "Weather in Rome?"}, _call("Rome", 2),
            {"role": "user", "content": "Weather in Berlin?"}]


@pytest.fixture(scope="module")
def server(float_dirs):
    global MODEL
    MODEL = str(float_dirs["smollm2"])
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 8, "--log-level", "info")
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def oracle(float_dirs):
    return load(str(float_dirs["smollm2"]))


def check_calls(calls):
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_startup_log_names_the_format(server):
    assert "tool calls: generic" in server.output()


def test_tools_reach_the_prompt(client, oracle):
    tokenizer = oracle[1]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=1, tools=[WEATHER])
    described = tokenizer.apply_chat_template(generic_messages(ask, [WEATHER]),
                                              add_generation_prompt=True)
    plain = tokenizer.apply_chat_template(ask, add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(described) > len(plain) + 100
    text = tokenizer.decode(described)
    assert '"name": "get_weather"' in text and "<tool_call>" in text
    # tool_choice "none": no tools in the prompt.
    out = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=1, tools=[WEATHER],
                                         tool_choice="none")
    assert out.usage.prompt_tokens == len(plain)


def test_auto_call_is_constrained_once_it_starts(client, server, oracle):
    tokenizer = oracle[1]
    # Unconstrained (the same prompt as a completion), the model writes "Berlin".
    prompt = tokenizer.apply_chat_template(generic_messages(FEW_SHOT, [WEATHER]), tokenize=False,
                                           add_generation_prompt=True)
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30).choices[0].text
    assert free.startswith("<tool_call>") and '"Berlin"' in free, free
    out = client.chat.completions.create(model=MODEL, messages=FEW_SHOT, max_tokens=40,
                                         tools=[WEATHER])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "berlin"}
    assert out.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    # Streamed: the same call as tool-call deltas, no markup in the content.
    chunks = list(client.chat.completions.create(model=MODEL, messages=FEW_SHOT, max_tokens=40,
                                                 tools=[WEATHER], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [t for d in deltas for t in d.tool_calls or []]
    assert [t.function.name for t in streamed if t.function.name] == ["get_weather"]
    assert "".join(t.function.arguments or "" for t in streamed) == call.function.arguments
    assert "<tool_call>" not in "".join(d.content or "" for d in deltas)


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_with_and_without_parallel(client, parallel):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris and the time in UTC?"}],
        tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel,
        max_tokens=120)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    calls = choice.message.tool_calls
    check_calls(calls)
    # SmolLM2 asks for both tools when it may; exactly one when parallel calls are off.
    assert len(calls) == (2 if parallel else 1), calls


def _allowed(processor, vocab):
    return np.isfinite(np.array(processor.bias(vocab)[0]))


def test_grammar_shapes(oracle):
    """What the grammars allow after a prefix, on the real tokenizer: free text until the
    start marker, then only the call; after a call, more text (parallel) or the end."""
    tokenizer = oracle[1]
    vocab, eos = len(tokenizer), tokenizer.eos_token_id

    def after(grammar, text):
        p = GrammarProcessor(tokenizer, grammar_spec(grammar=grammar))
        for t in tokenizer.encode(text, add_special_tokens=False):
            assert p._matcher.consume_token(t), (text, p._matcher.get_error())
        return _allowed(p, vocab)

    lazy = tool_choice_grammar([WEATHER], "auto", parallel=True, lazy=True)
    assert after(lazy, "Let me see.").sum() > vocab // 2 and after(lazy, "Let me see.")[eos]
    opened = after(lazy, "Let me see. <tool_call>\n")
    assert not opened[eos] and 0 < opened.sum() < 10
    assert all(tokenizer.decode([t]).startswith("{") for t in np.flatnonzero(opened))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "rome"}}\n</tool_call>'
    assert after(lazy, "Sure. " + call).sum() > vocab // 2
    single = tool_choice_grammar([WEATHER], "auto", parallel=False, lazy=True)
    assert np.flatnonzero(after(single, "Sure. " + call)).tolist() == [eos]
    # Forced: calls back to back when parallel, the end after one otherwise.
    required = tool_choice_grammar([WEATHER, TIME], "required", parallel=True)
    assert after(required, call)[eos] and after(required, call + "\n<tool_call>\n").sum() < 10
    one = tool_choice_grammar([WEATHER, TIME], "required", parallel=False)
    assert np.flatnonzero(after(one, call)).tolist() == [eos]
    # Not generic: "auto" constrains nothing.
    assert tool_choice_grammar([WEATHER], "auto", lazy=False) is None


def test_history_is_written_for_the_template(client, oracle):
    """Past calls and tool results reach a template that cannot show them."""
    tokenizer = oracle[1]
    messages = FEW_SHOT[:2] + [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                               {"role": "user", "content": "Thanks."}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                         tools=[WEATHER])
    rendered = generic_messages(messages, [WEATHER])
    text = tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    assert out.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))


def test_responses_and_messages_parse_generic_calls(client, server):
    import anthropic

    tool = {"type": "function", **WEATHER["function"]}
    few_shot = [{"role": m["role"], "content": m["content"]} if m["role"] == "user" else
                {"type": "function_call", "call_id": m["tool_calls"][0]["id"], "name": "get_weather",
                 "arguments": m["tool_calls"][0]["function"]["arguments"]} for m in FEW_SHOT]
    r = client.responses.create(model=MODEL, input=few_shot, tools=[tool], max_output_tokens=40)
    [item] = r.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert json.loads(item.arguments) == {"city": "berlin"}
    one = client.responses.create(model=MODEL, input="Weather in Rome and the time in CET?",
                                  tools=[tool, {"type": "function", **TIME["function"]}],
                                  tool_choice="required", parallel_tool_calls=False,
                                  max_output_tokens=60)
    assert [i.type for i in one.output] == ["function_call"] and one.parallel_tool_calls is False
    claude = anthropic.Anthropic(base_url=server.url, api_key="none")
    blocks = [{"role": "user", "content": m["content"]} if m["role"] == "user" else
              {"role": "assistant", "content": [{"type": "tool_use", "id": m["tool_calls"][0]["id"],
                                                 "name": "get_weather", "input": json.loads(
                                                     m["tool_calls"][0]["function"]["arguments"])}]}
              for m in FEW_SHOT]
    msg = claude.messages.create(model=MODEL, max_tokens=40, messages=blocks, tools=[{
        "name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}])
    [use] = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and use.name == "get_weather" and use.input == {"city": "berlin"}


HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "</tools> Reply with <tool_call>{\"name\": name, \"arguments\": args}</tool_call>"
    "{{ tool_call.name if tool_call is defined else '' }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_resolved_formats(oracle, float_dirs):
    """The startup decision: SmolLM2's template renders no tools (generic); a template
    with Hermes markup keeps its own family; a named parser that cannot work is refused."""
    from transformers import AutoTokenizer

    tokenizer = oracle[1]
    generic = resolve_tool_format(tokenizer)
    assert generic.generic and generic.family.name == "json_tools"
    assert resolve_tool_format(tokenizer, "json_tools").generic
    with pytest.raises(ValueError, match="renders no tools"):
        resolve_tool_format(tokenizer, "mistral")
    hermes = AutoTokenizer.from_pretrained(str(float_dirs["smollm2"]))
    hermes.chat_template = HERMES_TEMPLATE
    own = resolve_tool_format(hermes)
    assert not own.generic and own.family.name == "json_tools" and own.source == "template"
    assert "chat template's markup" in own.describe()
    named = resolve_tool_format(hermes, "qwen3_coder")
    assert not named.generic and named.family.name == "qwen3_coder" and named.source == "parser"


def test_whitespace_and_cut_off_calls_are_not_content():
    from mlx_lm_batched.tool_parsers import ChatOutputParser, get_family

    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    parser = ChatOutputParser(get_family("json_tools"))
    parsed = parser.parse(call + "\n" + call + '\n<tool_call>\n{"name": "get_ti')
    assert parsed["content"] == "" and len(parsed["tool_calls"]) == 2
    # Streamed in pieces: whitespace between calls is dropped, text after them is kept.
    parser, content, calls = ChatOutputParser(get_family("json_tools")), "", 0
    for piece in [call[:20], call[20:], "\n", " \n", call, "\nDone."]:
        out = parser.feed(piece)
        content, calls = content + out["content"], calls + len(out["tool_calls"])
    assert content + parser.finish()["content"] == "\nDone." and calls == 2
    # Alone, a cut-off call is what the model wrote: it stays in the content.
    lone = ChatOutputParser(get_family("json_tools")).parse('Hi <tool_call>\n{"name": "get_ti')
    assert lone["content"] == 'Hi <tool_call>\n{"name": "get_ti' and not lone["tool_calls"]
