"""64 concurrent streaming clients on one server; 16 drop their stream midway, and 8
others ask for JSON (``response_format`` json_schema): constrained and free rows mixed.

Every completed stream must be whole and equal to its prompt generated alone (greedy);
afterwards no row is left running and the KV memory is back to idle, which also shows
the dropped rows left the batch (they were asked for 256 tokens with EOS banned).
"""

import asyncio
import json
import time

import httpx
import pytest

from mlx_lm_batched import batch_generate, generate, load
from server_harness import ServerProcess

# 64 concurrent streams against solo generation: left out of the quick run (-m "not slow").
pytestmark = pytest.mark.slow

CLIENTS, DROPPED, MAX_TOKENS = 64, 16, 12
TOPICS = ["the sea", "a red fox", "winter", "bread", "rivers", "the moon", "bees", "trains",
          "chess", "a lighthouse", "rain", "tea", "mountains", "owls", "clocks", "gardens"]


SCHEMA = {"type": "object", "properties": {"sunny": {"type": "boolean"}}, "required": ["sunny"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}


def constrained(i):
    return i % 8 == 1  # never a dropped client (those are i % 4 == 0)


def messages(i):
    return [{"role": "user", "content": f"Write one sentence about {TOPICS[i % len(TOPICS)]}."}]


@pytest.fixture(scope="module")
def server(float_dirs):
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 64, "--prefill-batch", 16)
    yield srv
    assert srv.stop() == 0, srv.output()


async def stream_chat(http, i, drop):
    """The streamed text and finish reason of client ``i`` (None for a dropped stream)."""
    body = {"messages": messages(i), "stream": True, "temperature": 0,
            "max_tokens": 256 if drop else MAX_TOKENS}
    if constrained(i):
        body["response_format"] = FORMAT
    if drop:
        body["logit_bias"] = {"2": -100}  # SmolLM2's EOS: the row would run 256 steps
    text, finish, chunks = "", None, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return text, finish
            choice = json.loads(data)["choices"][0]
            text += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
            chunks += 1
            if drop and chunks >= 4:
                return None  # leaving the block closes the connection mid-stream
    raise AssertionError(f"client {i}: stream ended without [DONE]")


async def run_clients(url):
    limits = httpx.Limits(max_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        drops = [i % (CLIENTS // DROPPED) == 0 for i in range(CLIENTS)]
        return await asyncio.gather(*(stream_chat(http, i, d) for i, d in enumerate(drops))), drops


def test_64_streams_16_dropped(server, float_dirs):
    model, tokenizer = load(str(float_dirs["smollm2"]))
    expected = [generate(model, tokenizer, tokenizer.apply_chat_template(messages(i), add_generation_prompt=True),
                         max_tokens=MAX_TOKENS) for i in range(len(TOPICS))]
    as_json = {i: batch_generate(model, tokenizer, [tokenizer.apply_chat_template(
        messages(i), add_generation_prompt=True)], max_tokens=MAX_TOKENS,
        response_format=FORMAT).texts[0] for i in range(len(TOPICS)) if constrained(i)}
    idle = server.metrics()
    tic = time.monotonic()
    results, drops = asyncio.run(run_clients(server.url))
    elapsed = time.monotonic() - tic
    for i, (result, drop) in enumerate(zip(results, drops)):
        if drop:
            assert result is None
            continue
        text, finish = result
        if constrained(i):
            assert text == as_json[i % len(TOPICS)], (i, text)
            assert isinstance(json.loads(text)["sunny"], bool)
            continue
        assert text == expected[i % len(TOPICS)], (i, text)
        assert finish in ("stop", "length")
    m = server.metrics_when_idle()
    assert m["mlx_lm_batched_running_rows"] == 0 and m["mlx_lm_batched_waiting_rows"] == 0
    assert m["mlx_lm_batched_kv_cache_bytes"] == 0 and m["mlx_lm_batched_kv_reserved_bytes"] == 0
    # Active memory: idle plus what the prefix cache now keeps, plus a little slack.
    slack = 64 << 20
    assert m["mlx_lm_batched_memory_active_bytes"] <= (
        idle["mlx_lm_batched_memory_active_bytes"] + m["mlx_lm_batched_prefix_cache_bytes"] + slack)
    generated = m["mlx_lm_batched_generation_tokens_total"] - idle["mlx_lm_batched_generation_tokens_total"]
    # Dropped rows stopped within a few steps of their drop (not 256 tokens each).
    assert generated < (CLIENTS - DROPPED) * MAX_TOKENS + DROPPED * 40, generated
    print(f"\n64 streams in {elapsed:.1f} s, {generated:.0f} tokens generated")
