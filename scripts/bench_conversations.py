#!/usr/bin/env python
"""Conversations that share a long system prompt, against one server: prefix reuse and memory.

    python scripts/bench_conversations.py --model DIR [--conversations 16] [--turns 3]
        [--system-tokens 1800] [--max-tokens 16] [--json out.json] [-- SERVER ARGS...]

Starts ``python -m mlx_lm_batched.server`` (whatever ``PYTHONPATH`` imports: run it with
another checkout's path to measure that code) on 127.0.0.1, sends one short warm-up
request, then runs every conversation at once (one thread each, the official ``openai``
client, streamed chat completions, greedy): turn ``t`` sends the system prompt, the
conversation's earlier turns with the answers it got, and a new user message.

Reported: the CPU (``lscpu``) and load average, wall time of the conversations, the
server's peak resident memory above its warm RSS (``/proc/PID/status`` sampled every
20 ms), the prefix hit rate (``usage.prompt_tokens_details.cached_tokens`` over prompt
tokens), the server's MLX peak memory above its warm active memory (``/metrics``:
arrays only, where RSS also counts freed heap the process keeps), and time to first
token p50/p95 for each turn. ``$BENCH_SERVER_LOG``: a file for the server's output
(default: discarded).
"""

import argparse
import json
import statistics
import time
from concurrent import futures
from pathlib import Path

from bench_serving_harness import (
    PeakRSS,
    corpus_text,
    free_port,
    machine,
    metrics,
    pct,
    rss_bytes,
    start_server,
    stop_server,
    tokenizer,
)
from bench_serving_harness import stream_chat as chat


def conversation(client, system, index, turns, max_tokens):
    messages = [{"role": "system", "content": system}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Conversation {index}, question {t + 1}: "
                         f"what does the passage say about topic number {index * 7 + t}?"})
        answer, ttft, prompt, cached = chat(client, messages, max_tokens)
        messages.append({"role": "assistant", "content": answer})
        out.append({"turn": t + 1, "ttft": ttft, "prompt_tokens": prompt, "cached_tokens": cached})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--system-tokens", type=int, default=1800)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--json")
    p.add_argument("server_args", nargs="*", help="after --: extra server flags")
    args = p.parse_args()
    from openai import OpenAI

    system = corpus_text(tokenizer(args.model), args.system_tokens)
    port = free_port()
    proc = start_server(args.model, port, args.server_args)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600)
        chat(client, [{"role": "user", "content": "Hello"}], 2)
        warm = rss_bytes(proc.pid)
        time.sleep(0.5)  # the engine's gauges refresh while it is idle
        warm_active = metrics(port).get("mlx_lm_batched_memory_active_bytes", 0)
        sampler = PeakRSS(proc.pid)
        sampler.start()
        start = time.monotonic()
        with futures.ThreadPoolExecutor(args.conversations) as pool:
            runs = list(pool.map(lambda i: conversation(client, system, i, args.turns,
                                                        args.max_tokens),
                                 range(args.conversations)))
        wall = time.monotonic() - start
        sampler.stop()
        time.sleep(0.5)
        peak = metrics(port).get("mlx_lm_batched_memory_peak_bytes", 0)
    finally:
        stop_server(proc)
    records = [r for run in runs for r in run]
    report = {
        **machine(),
        "conversations": args.conversations, "turns": args.turns, "wall_s": round(wall, 2),
        "warm_rss_bytes": warm, "peak_rss_above_warm_bytes": sampler.peak - warm,
        "mlx_peak_above_warm_active_bytes": int(peak - warm_active),
        "prefix_hit_rate": round(sum(r["cached_tokens"] for r in records)
                                 / max(1, sum(r["prompt_tokens"] for r in records)), 4),
        "ttft_by_turn": {t: {"p50": round(statistics.median(v), 3), "p95": round(pct(v, 0.95), 3)}
                         for t in range(1, args.turns + 1)
                         for v in [[r["ttft"] for r in records if r["turn"] == t]]},
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({**report, "records": runs}, indent=2))


if __name__ == "__main__":
    main()
