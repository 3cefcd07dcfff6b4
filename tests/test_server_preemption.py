"""Preemption in the server: rows reserve their tokens plus ``--kv-growth-tokens`` ahead;
when a growing row finds the KV bound full, the newest request leaves the batch, waits
first in line and resumes later. Every request is answered 200 with the text it gets
alone (greedy and seeded sampling, streamed or not), whether its KV was parked in the
block store or recomputed, and ``/metrics`` counts the preemptions (real SmolLM2
weights, a real server process)."""

import concurrent.futures as futures

import openai
import pytest

from server_harness import ServerProcess
from test_server_errors import kv_bytes_per_token

# The KV bounds below are sized from MAX_TOKENS, so rows admitted with their prompt and
# --kv-growth-tokens outgrow the bound while decoding whatever its value (the tests assert
# the preemptions); 32 tokens keep the 8 requests' serial and concurrent runs short.
MAX_TOKENS = 32


def bodies():
    """Eight greedy requests. (Seeded sampling keeps its key stream across a preemption:
    tests/test_preemption.py; its text equals the request alone only where the logits are
    the same bits, and a batch's grouped prefill is within the float bound, not bits.)"""
    return [{"prompt": f"Write a long story about the number {i}:", "max_tokens": MAX_TOKENS,
             "temperature": 0} for i in range(8)]


@pytest.mark.parametrize("prefix_flags", [[], ["--prompt-cache-size", "0"]],
                         ids=["parked-blocks", "recomputed"])
def test_rows_preempted_for_memory_resume_with_their_own_text(float_dirs, prefix_flags):
    """Room for about three requests at their full length, eight at once that each first
    reserve their prompt and 8 tokens: rows are preempted as they grow, and every answer
    is the one the request gets alone (greedy), none 429 or 5xx."""
    d = float_dirs["smollm2"]
    full = kv_bytes_per_token(d) * (16 + MAX_TOKENS)  # prompts are under 16 tokens
    srv = ServerProcess(d, "--max-kv-bytes", 3 * full, "--prompt-cache-bytes", 50_000_000,
                        "--kv-growth-tokens", 8, "--kv-block-size", 16, "--log-level", "info",
                        *prefix_flags)
    try:
        alone = []
        for body in bodies():
            code, out, _ = srv.post("/v1/completions", body)
            assert code == 200, out
            alone.append(out["choices"][0]["text"])
        assert srv.metrics()["mlx_lm_batched_preemptions_total"] == 0  # one at a time
        with futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda b: srv.post("/v1/completions", b), bodies()))
        assert [code for code, _, _ in results] == [200] * 8, results
        assert [out["choices"][0]["text"] for _, out, _ in results] == alone
        assert all(out["usage"]["completion_tokens"] == MAX_TOKENS for _, out, _ in results)
        metrics = srv.metrics_when_idle()
        assert metrics["mlx_lm_batched_preemptions_total"] >= 1, srv.output()
        assert metrics["mlx_lm_batched_kv_reserved_bytes"] == 0
        assert "preempted request" in srv.output()
    finally:
        assert srv.stop() == 0, srv.output()


def test_streams_preempted_for_memory_keep_their_text(float_dirs):
    """Streamed chat completions through the official client, preempted mid-stream: each
    stream's text is the one it gets alone."""
    d = float_dirs["smollm2"]
    full = kv_bytes_per_token(d) * (64 + MAX_TOKENS)  # chat prompts are under 64 tokens
    srv = ServerProcess(d, "--max-kv-bytes", full + full // 4, "--prompt-cache-bytes", 50_000_000,
                        "--kv-growth-tokens", 8, "--kv-block-size", 16)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")

    def chat(i):
        stream = client.chat.completions.create(
            model=str(d), stream=True, max_tokens=MAX_TOKENS, temperature=0,
            messages=[{"role": "user", "content": f"Write a long story about the number {i}."}])
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    try:
        alone = [chat(i) for i in range(5)]
        with futures.ThreadPoolExecutor(5) as pool:
            together = list(pool.map(chat, range(5)))
        assert together == alone
        assert srv.metrics()["mlx_lm_batched_preemptions_total"] >= 1
    finally:
        assert srv.stop() == 0, srv.output()


def test_growth_zero_reserves_everything_and_never_preempts(float_dirs):
    d = float_dirs["smollm2"]
    full = kv_bytes_per_token(d) * (16 + MAX_TOKENS)
    srv = ServerProcess(d, "--max-kv-bytes", 3 * full, "--prompt-cache-bytes", 50_000_000,
                        "--kv-growth-tokens", 0)
    try:
        with futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda b: srv.post("/v1/completions", b), bodies()))
        assert [code for code, _, _ in results] == [200] * 8, results
        assert srv.metrics()["mlx_lm_batched_preemptions_total"] == 0
    finally:
        assert srv.stop() == 0, srv.output()
