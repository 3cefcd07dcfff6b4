#!/usr/bin/env python
"""A long prefix survives ``kill -9`` in ``--kv-disk-dir``, and a second server process reads it.

    python scripts/bench_kv_restart.py --model DIR [--system-tokens 1800] [--max-tokens 16]
        [--json out.json] [-- SERVER ARGS...]

On 127.0.0.1, each server ``python -m mlx_lm_batched.server --kv-disk-dir D`` (whatever
``PYTHONPATH`` imports) with one short warm-up request before it is measured:

1. cold: a server on a fresh directory D answers a streamed greedy chat turn whose system
   prompt is ``--system-tokens`` of corpus text (its TTFT is the cold prefill's); once its
   KV blocks are on disk (``/metrics``: block files, nothing queued) it is killed with
   SIGKILL;
2. restart: a new server on D answers the same turn first: ``cached_tokens`` (from disk,
   nothing in memory yet) and TTFT, against the target of a third of the cold TTFT, and
   its answer against the cold one;
3. second process: while the restarted server runs, another server process on D answers
   a turn with the same system prompt and another question: its ``cached_tokens`` and TTFT.

``$BENCH_SERVER_LOG``: a file for the servers' output.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench_serving_harness import (
    corpus_text,
    free_port,
    machine,
    metrics,
    start_server,
    stop_server,
    stream_chat,
    tokenizer,
)

PREFIX = "mlx_lm_batched_"
DISK_WAIT_S = 120


def client_for(port):
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600,
                  max_retries=0)


def serve(model, disk_dir, extra):
    """A started server on ``disk_dir`` after one short warm-up turn: ``(process, port, client)``."""
    port = free_port()
    proc = start_server(model, port, ["--kv-disk-dir", str(disk_dir), *extra])
    client = client_for(port)
    stream_chat(client, [{"role": "user", "content": "Hello"}], 2)
    return proc, port, client


def turn(client, system, question, max_tokens):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    answer, ttft, prompt, cached = stream_chat(client, messages, max_tokens)
    return {"answer": answer, "ttft_s": round(ttft, 3), "prompt_tokens": prompt,
            "cached_tokens": cached}


def block_size(server_args):
    """The server's ``--kv-block-size`` among ``server_args`` (its default, 32, if absent)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--kv-block-size", type=int, default=32)
    return p.parse_known_args(server_args)[0].kv_block_size


def wait_on_disk(port, blocks):
    """At least ``blocks`` block files written and none queued, per ``/metrics``: the
    gauges when so. (A finished row's blocks reach the store after its answer, so the
    queue may be empty before the last of them is queued: count them too.)"""
    deadline = time.monotonic() + DISK_WAIT_S
    while True:
        m = metrics(port)
        on_disk = m.get(PREFIX + "kv_blocks_on_disk", 0)
        queued = m.get(PREFIX + "kv_blocks_disk_write_queue_bytes", 0)
        if on_disk >= blocks and queued == 0:
            return {"blocks_on_disk": on_disk, "disk_bytes": m.get(PREFIX + "kv_blocks_disk_bytes")}
        if time.monotonic() > deadline:
            raise SystemExit(f"blocks not on disk after {DISK_WAIT_S} s: {on_disk} of {blocks} files, "
                             f"{queued} bytes queued")
        time.sleep(0.2)


def run(args, disk_dir):
    system = corpus_text(tokenizer(args.model), args.system_tokens)
    question = "Summarize the passage above in one sentence."
    procs = []
    try:
        proc, port, client = serve(args.model, disk_dir, args.server_args)
        procs.append(proc)
        cold = turn(client, system, question, args.max_tokens)
        # The prompt's full blocks (the answer's tokens may add more).
        cold["disk"] = wait_on_disk(port, cold["prompt_tokens"] // block_size(args.server_args))
        proc.kill()  # SIGKILL: nothing is flushed on the way out
        proc.wait()
        proc, port, client = serve(args.model, disk_dir, args.server_args)
        procs.append(proc)
        restart = turn(client, system, question, args.max_tokens)
        other_proc, _, other_client = serve(args.model, disk_dir, args.server_args)
        procs.append(other_proc)
        second = turn(other_client, system, "What is the passage above about?", args.max_tokens)
    finally:
        for p in procs:
            if p.poll() is None:
                stop_server(p)
    ratio = restart["ttft_s"] / cold["ttft_s"]
    return {
        **machine(), "model": str(args.model), "system_tokens": args.system_tokens,
        "max_tokens": args.max_tokens, "server_args": args.server_args,
        "cold": cold, "restart": restart, "second_process": second,
        "restart_ttft_over_cold": round(ratio, 3), "restart_within_target": ratio <= 1 / 3,
        "restart_answer_equal_cold": restart["answer"] == cold["answer"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--system-tokens", type=int, default=1800)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--json")
    p.add_argument("server_args", nargs="*", help="after --: extra server flags")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kv-disk-") as disk_dir:
        report = run(args, disk_dir)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
