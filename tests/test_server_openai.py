"""The server against the official ``openai`` client, on real SmolLM2 (float32).

Greedy answers must equal the same prompt generated alone in this process with
``mlx_lm_batched.generate`` (same chat template rendering, same tokens).
"""

import concurrent.futures as futures

import openai
import pytest

from mlx_lm_batched import generate, load, stream_generate
from mlx_lm_batched.server.tool_calls import ChatOutput, check_tool_choice, delta_fields, message_fields
from mlx_lm_batched.server.tool_format import generic_messages
from mlx_lm_batched.tool_parsers import get_family
from server_harness import ServerProcess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = "Once upon a time, in a small village by the sea,"


@pytest.fixture(scope="module")
def server(float_dirs):
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 16)
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def oracle(float_dirs):
    return load(str(float_dirs["smollm2"]))


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def chat_ids(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def solo(oracle, prompt, max_tokens):
    model, tokenizer = oracle
    return generate(model, tokenizer, prompt, max_tokens=max_tokens)


def test_chat_greedy_equals_solo_and_stream(client, model_id, oracle):
    out = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=24,
                                         temperature=0)
    expected = solo(oracle, chat_ids(oracle[1], QUESTION), 24)
    assert out.choices[0].message.content == expected
    assert out.choices[0].message.role == "assistant"
    assert out.usage.prompt_tokens == len(chat_ids(oracle[1], QUESTION))
    assert out.usage.completion_tokens >= 1
    chunks = list(client.chat.completions.create(
        model=model_id, messages=QUESTION, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [out.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == out.usage.completion_tokens


def test_completions_plain_stream_and_token_prompt(client, model_id, oracle):
    expected = solo(oracle, STORY, 16)
    out = client.completions.create(model=model_id, prompt=STORY, max_tokens=16, temperature=0)
    assert out.choices[0].text == expected
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 16
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt=STORY, max_tokens=16, temperature=0, stream=True) if c.choices)
    assert streamed == expected
    ids = oracle[1].encode(STORY)
    by_ids = client.completions.create(model=model_id, prompt=ids, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == expected


def test_logprobs_match_solo(client, model_id, oracle):
    model, tokenizer = oracle
    prompt = chat_ids(tokenizer, QUESTION)
    solo_steps = list(stream_generate(model, tokenizer, prompt, max_tokens=6))
    out = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=6,
                                         temperature=0, logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert "".join(e.token for e in content) == out.choices[0].message.content
    for entry, step in zip(content, solo_steps):
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)  # greedy
        assert entry.logprob == pytest.approx(float(step.logprobs[step.token]), abs=1e-3)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
    text = client.completions.create(model=model_id, prompt=STORY, max_tokens=5, temperature=0,
                                     logprobs=2)
    lp = text.choices[0].logprobs
    assert "".join(lp.tokens) == text.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and len(lp.top_logprobs[0]) == 2


def test_stop_strings(client, model_id, oracle):
    expected = solo(oracle, STORY, 16)
    cut = expected.strip().split(" ")[2]  # a word inside the answer
    out = client.completions.create(model=model_id, prompt=STORY, max_tokens=16, temperature=0,
                                    stop=[cut, "never-appears"])
    assert out.choices[0].text == expected[: expected.index(cut)]
    assert out.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt=STORY, max_tokens=16, temperature=0, stop=cut, stream=True) if c.choices)
    assert streamed == out.choices[0].text


def test_n_and_seeded_sampling(client, model_id, oracle):
    greedy = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=10,
                                            temperature=0, n=2)
    assert [c.index for c in greedy.choices] == [0, 1]
    assert greedy.choices[0].message.content == greedy.choices[1].message.content == solo(
        oracle, chat_ids(oracle[1], QUESTION), 10)

    def sample(seed, n=1):
        out = client.completions.create(model=model_id, prompt=STORY, max_tokens=16, temperature=1.0,
                                        top_p=0.95, seed=seed, n=n)
        return [c.text for c in out.choices]

    alone = sample(7, n=2)
    assert alone[0] != alone[1]  # the choices draw from different streams
    # The same seed gives the same tokens while other (unseeded) requests share the batch.
    with futures.ThreadPoolExecutor(4) as pool:
        noise = [pool.submit(sample, None) for _ in range(3)]
        again = pool.submit(sample, 7, 2)
        assert again.result() == alone
        for f in noise:
            f.result()
    assert sample(8) != alone[:1]


def test_prefix_cache_second_turn(client, model_id, oracle):
    first = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=12,
                                           temperature=0)
    turn = QUESTION + [{"role": "assistant", "content": first.choices[0].message.content},
                       {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model=model_id, messages=turn, max_tokens=12,
                                            temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > len(chat_ids(oracle[1], QUESTION)) // 2
    assert second.choices[0].message.content == solo(oracle, chat_ids(oracle[1], turn), 12)


def test_logit_bias_and_penalties(client, model_id, oracle):
    tokenizer = oracle[1]
    greedy = client.completions.create(model=model_id, prompt=STORY, max_tokens=4, temperature=0)
    first = tokenizer.encode(greedy.choices[0].text)[0]
    biased = client.completions.create(model=model_id, prompt=STORY, max_tokens=4, temperature=0,
                                       logit_bias={str(first): -100})
    assert tokenizer.encode(biased.choices[0].text)[0] != first
    penalised = client.completions.create(model=model_id, prompt=STORY, max_tokens=24, temperature=0,
                                          frequency_penalty=2.0, presence_penalty=1.0,
                                          extra_body={"repetition_penalty": 1.3})
    assert penalised.choices[0].text != solo(oracle, STORY, 24)


def test_tools_reach_the_template(client, model_id, oracle):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    out = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8,
                                         temperature=0, tools=tools)
    # SmolLM2's template renders no tools: the server describes them in the system prompt
    # (the generic tool format, tests/test_server_tools_generic.py).
    rendered = oracle[1].apply_chat_template(generic_messages(QUESTION, tools),
                                             add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(rendered) > len(chat_ids(oracle[1], QUESTION))
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # tool_choice "none": no tools in the prompt
    assert check_tool_choice("none", tools) is None and check_tool_choice("auto", tools) == tools
    out = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=1,
                                         temperature=0, tools=tools, tool_choice="none")
    assert out.usage.prompt_tokens == len(chat_ids(oracle[1], QUESTION))
    # A forced call of a tool the request does not define: one line, naming the field (the
    # forced forms themselves: tests/test_server_structured.py).
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=1,
                                       tools=tools, tool_choice={"type": "function",
                                                                 "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice" and "'nope'" in e.value.body["message"]


def test_tool_call_parsing():
    text = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><tool_call>{"name": "bad"</tool_call>')
    output = ChatOutput(get_family("json_tools"))
    message = message_fields(output.parser().parse(text))
    assert message["content"] == 'Let me check.<tool_call>{"name": "bad"</tool_call>'
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert calls[0]["function"]["arguments"] == '{"city": "Paris"}' and calls[0]["type"] == "function"
    parser, got_text, got_calls = output.parser(), "", []
    for i in range(0, len(text), 3):  # cut everywhere, including inside the tags
        delta = delta_fields(parser.feed(text[i : i + 3]))
        got_text += delta.get("content", "")
        got_calls += delta.get("tool_calls", [])
    delta = delta_fields(parser.finish())
    assert got_text + delta.get("content", "") == message["content"]
    assert [x["function"] for x in got_calls] == [calls[0]["function"]]


def test_metrics_after_requests(server):
    m = server.metrics()
    assert m["mlx_lm_batched_running_rows"] == 0
    assert m["mlx_lm_batched_generation_tokens_total"] > 0
    assert m["mlx_lm_batched_queue_time_seconds_count"] > 0
    assert m["mlx_lm_batched_kv_cache_bytes"] == 0


def test_readme_server_examples_run_as_written(server, oracle):
    """The README's curl command and openai snippet, against this server (only the port differs)."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Server"):]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    to_port = lambda text: text.replace("127.0.0.1:8080", f"127.0.0.1:{server.port}")  # noqa: E731
    curl = [b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if b.lstrip().startswith("curl")]
    assert len(curl) == 1, "the README's Server section lost its curl example"
    proc = subprocess.run(["bash", "-c", to_port(curl[0])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)["choices"][0]["message"]["content"]
    assert answer == solo(oracle, chat_ids(oracle[1], QUESTION), 32)
    snippets = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(snippets) == 1, "the README's Server section lost its openai example"
    proc = subprocess.run([sys.executable, "-c", to_port(snippets[0])], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    haiku = [{"role": "user", "content": "Write a haiku about the sea."}]
    assert proc.stdout.strip() == solo(oracle, chat_ids(oracle[1], haiku), 48).strip()
