"""Benchmark our server against ``mlx_lm.server`` under concurrent streaming clients.

Both servers run as subprocesses on the same model directory; each gets the same
``--clients`` concurrent greedy chat requests (distinct short prompts, streamed), and
the script reports wall time, output tokens/s, time to first token (p50/p95) and how
many answers the two servers agree on. Needs ``pip install mlx-lm httpx``.

    python scripts/bench_server.py --model DIR [--clients 32] [--max-tokens 64] [--json out.json]
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

TOPICS = ["the sea", "a red fox", "winter", "bread", "rivers", "the moon", "bees", "trains",
          "chess", "a lighthouse", "rain", "tea", "mountains", "owls", "clocks", "gardens"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind, model, port):
    module = "mlx_lm_batched.server" if kind == "ours" else "mlx_lm.server"
    cmd = [sys.executable, "-m", module, "--model", model, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}")
        try:
            # mlx_lm.server answers /v1/models once it is up; ours too.
            urllib.request.urlopen(url + "/v1/models", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{module} did not start")


async def one(http, model, i, max_tokens):
    body = {"model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."}]}
    tic = time.perf_counter()
    first, text, chunks = None, "", 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            data = json.loads(line[5:])
            delta = (data.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
            if delta:
                first = first or time.perf_counter() - tic
                text += delta
                chunks += 1
    return {"ttft": first or 0.0, "text": text, "chunks": chunks}


async def run_clients(url, model, clients, max_tokens):
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=clients + 4)) as http:
        tic = time.perf_counter()
        results = await asyncio.gather(*(one(http, model, i, max_tokens) for i in range(clients)))
        return results, time.perf_counter() - tic


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def bench(kind, model, clients, max_tokens, tokenizer):
    proc, url = start(kind, model, free_port())
    try:
        asyncio.run(run_clients(url, model, 2, 4))  # warm-up
        results, wall = asyncio.run(run_clients(url, model, clients, max_tokens))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    tokens = sum(len(tokenizer.encode(r["text"], add_special_tokens=False)) for r in results)
    ttft = [r["ttft"] for r in results]
    return {"server": kind, "clients": clients, "wall_s": round(wall, 3),
            "output_tokens": tokens, "output_tok_s": round(tokens / wall, 2),
            "ttft_p50_s": round(pct(ttft, 0.5), 3), "ttft_p95_s": round(pct(ttft, 0.95), 3),
            "texts": [r["text"] for r in results]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory both servers can load")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--only", choices=["ours", "mlx_lm"], help="run one server only")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.fspath(args.model))
    kinds = [args.only] if args.only else ["ours", "mlx_lm"]
    rows = [bench(k, args.model, args.clients, args.max_tokens, tokenizer) for k in kinds]
    print(f"{'server':<8} {'clients':>7} {'wall s':>8} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p95':>9}")
    for r in rows:
        print(f"{r['server']:<8} {r['clients']:>7} {r['wall_s']:>8} {r['output_tok_s']:>8} "
              f"{r['ttft_p50_s']:>9} {r['ttft_p95_s']:>9}")
    if len(rows) == 2:
        same = sum(a == b for a, b in zip(rows[0]["texts"], rows[1]["texts"]))
        print(f"identical answers: {same}/{args.clients}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
