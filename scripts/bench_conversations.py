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
arrays only, where RSS also counts the heap and allocator caches), and time to first
token p50/p95 for each turn. ``$BENCH_SERVER_LOG``: a file
for the server's output (default: discarded).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "corpus.txt"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS(threading.Thread):
    """Samples a process's RSS until stopped; ``peak`` holds the largest seen."""

    def __init__(self, pid, every=0.02):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak, self._done = pid, every, 0, threading.Event()

    def run(self):
        while not self._done.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except OSError:
                return
            time.sleep(self.every)

    def stop(self):
        self._done.set()
        self.join()


def mlx_memory(port):
    """The server's MLX ``(active, peak)`` bytes from its ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("memory_active_bytes", "memory_peak_bytes"):
            if line.startswith(f"mlx_lm_batched_{name} "):
                values[name] = int(float(line.split()[1]))
    return values.get("memory_active_bytes", 0), values.get("memory_peak_bytes", 0)


def system_prompt(model_dir, n_tokens):
    """Corpus text (repeated) cut to about ``n_tokens`` tokens of the model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = CORPUS.read_text(encoding="utf-8")
    ids = tok.encode(text, add_special_tokens=False)
    ids = (ids * (n_tokens // len(ids) + 1))[:n_tokens]
    return tok.decode(ids)


def start_server(model_dir, port, extra):
    cmd = [sys.executable, "-m", "mlx_lm_batched.server", "--model", str(model_dir),
           "--served-model-name", "m", "--port", str(port), "--log-level", "warning", *extra]
    log = open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "w")
    # A neutral working directory: ``-m`` puts it first on sys.path, before PYTHONPATH.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not start in 300 s")


def chat(client, messages, max_tokens):
    """``(answer, ttft s, prompt tokens, cached tokens)`` of one streamed greedy chat turn."""
    sent = time.monotonic()
    ttft, parts, usage = None, [], None
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                if ttft is None:
                    ttft = time.monotonic() - sent
                parts.append(choice.delta.content)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", 0) or 0) if details else 0
    return "".join(parts), ttft if ttft is not None else time.monotonic() - sent, \
        usage.prompt_tokens, cached


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


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


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

    system = system_prompt(args.model, args.system_tokens)
    port = free_port()
    proc = start_server(args.model, port, args.server_args)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600)
        chat(client, [{"role": "user", "content": "Hello"}], 2)
        warm = rss_bytes(proc.pid)
        time.sleep(0.5)  # the engine's gauges refresh while it is idle
        warm_active, _ = mlx_memory(port)
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
        _, peak = mlx_memory(port)
    finally:
        proc.terminate()
        proc.wait(60)
    records = [r for run in runs for r in run]
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                if line.startswith("Model name")), "unknown")
    report = {
        "cpu": cpu, "load_average": os.getloadavg(), "pythonpath": os.environ.get("PYTHONPATH"),
        "conversations": args.conversations, "turns": args.turns, "wall_s": round(wall, 2),
        "warm_rss_bytes": warm, "peak_rss_above_warm_bytes": sampler.peak - warm,
        "mlx_peak_above_warm_active_bytes": peak - warm_active,
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
