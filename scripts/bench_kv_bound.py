#!/usr/bin/env python
"""Many distinct long requests at once against a KV memory bound: all answered, memory bounded.

    python scripts/bench_kv_bound.py --model DIR [--requests 64] [--prompt-tokens 1500]
        [--max-tokens 16] [--stop TEXT] [--kv-memory 0.5] [--check 8] [--client-timeout 3600]
        [--json out.json]
        [-- SERVER ARGS...]

Starts ``python -m mlx_lm_batched.server --kv-memory GB`` (whatever ``PYTHONPATH``
imports) on 127.0.0.1, sends one short warm-up request, then every request at once (one
thread each, the official ``openai`` client with no retries, streamed greedy
``/v1/completions`` on token-id prompts of exactly ``--prompt-tokens``, each the corpus
read from its own start, so no two share a cached block; ``--stop`` ends each at a stop
string, as chat answers end long before a generous ``max_tokens``). The bound admits a few
at a time; the others wait their turn.

Reported: the status of every request (the target: all 200, none 429 or 5xx), the
server's peak resident memory above its warm RSS (sampled every 20 ms) against
``--kv-memory`` plus 0.3 GB, MLX's active memory above its warm value (the arrays alone:
RSS also holds the freed heap that ``mlx_lm_batched._malloc`` keeps mapped, up to 1 GiB),
the most requests seen waiting for KV memory and the other gauges' peaks (``/metrics``,
every 0.25 s), the gauges at the poll where the server's RSS was largest (what it held
then: MLX's arrays and cache against its resident size), the preemptions (``/metrics`` ``preemptions_total``),
time to first token p50/p95/max and wall time; then the ``--check`` requests that
started last (the longest queued) are sent again one at a time, alone, and their greedy
tokens compared with the concurrent run's, token for token. ``$BENCH_SERVER_LOG``: a
file for the server's output.
"""

import argparse
import json
import threading
import time
from concurrent import futures
from pathlib import Path

from bench_serving_harness import (
    PeakRSS,
    distinct_prompts,
    free_port,
    machine,
    metrics,
    pct,
    rss_bytes,
    start_server,
    stop_server,
    stream_completion,
    tokenizer,
)

GB = 1e9
MARGIN_BYTES = 300_000_000  # the target: peak RSS above warm within the KV bound plus this
PREFIX = "mlx_lm_batched_"


class MetricsPeaks(threading.Thread):
    """Polls ``/metrics`` until stopped; ``peaks`` holds each watched gauge's largest value,
    ``at_peak_rss`` the gauges of the poll at which the server's RSS (read with each poll)
    was largest: what its memory held then."""

    WATCHED = ("kv_waiting_requests", "kv_reserved_bytes", "kv_cache_bytes", "prefix_cache_bytes",
               "kv_blocks_bytes", "running_rows", "memory_active_bytes", "memory_cache_bytes",
               "memory_resident_bytes")

    def __init__(self, port, pid, every=0.25):
        super().__init__(daemon=True)
        self.port, self.pid, self.every, self._done = port, pid, every, threading.Event()
        self.peaks = dict.fromkeys(self.WATCHED, 0.0)
        self.at_peak_rss = {"rss_bytes": 0}

    def run(self):
        while not self._done.is_set():
            try:
                values = metrics(self.port)
            except OSError:
                values = {}
            for name in self.WATCHED:
                self.peaks[name] = max(self.peaks[name], values.get(PREFIX + name, 0.0))
            rss = rss_bytes(self.pid)
            if values and rss > self.at_peak_rss["rss_bytes"]:
                self.at_peak_rss = {"rss_bytes": rss, **{n: values.get(PREFIX + n, 0.0)
                                                         for n in self.WATCHED}}
            self._done.wait(self.every)

    def stop(self):
        self._done.set()
        self.join()


def run(args):
    from openai import OpenAI

    prompts = distinct_prompts(tokenizer(args.model), args.requests, args.prompt_tokens)
    port = free_port()
    proc = start_server(args.model, port, ["--kv-memory", str(args.kv_memory),
                                           *args.server_args])
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                        timeout=args.client_timeout,
                        max_retries=0)  # a 429 must count, not be retried away
        stream_completion(client, prompts[0][:16], 2)
        warm_metrics = metrics(port)
        budget = warm_metrics.get(PREFIX + "kv_budget_bytes", 0.0)
        prefix_bound = warm_metrics.get(PREFIX + "kv_blocks_bytes_bound", 0.0)
        warm_active = warm_metrics.get(PREFIX + "memory_active_bytes", 0.0)
        warm = rss_bytes(proc.pid)
        rss, gauges = PeakRSS(proc.pid), MetricsPeaks(port, proc.pid)
        rss.start()
        gauges.start()
        start = time.monotonic()
        with futures.ThreadPoolExecutor(args.requests) as pool:
            results = list(pool.map(
                lambda p: stream_completion(client, p, args.max_tokens, args.stop), prompts))
        wall = time.monotonic() - start
        preemptions = metrics(port).get(PREFIX + "preemptions_total", 0.0)
        rss.stop()
        gauges.stop()
        ok = [i for i, r in enumerate(results) if r["status"] == 200]
        # The requests that started last waited longest: compare them with themselves alone.
        latest = sorted(ok, key=lambda i: results[i]["first"] or results[i]["end"])[-args.check:]
        alone = {i: stream_completion(client, prompts[i], args.max_tokens, args.stop)
                 for i in latest}
    finally:
        stop_server(proc)
    statuses = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    ttft = [r["first"] - r["sent"] for r in results if r["first"] is not None]
    peak_above = rss.peak - warm
    kv_memory = round(args.kv_memory * 1e9)  # admission and the prefix cache's blocks together
    equal = [i for i in latest if alone[i]["tokens"] == results[i]["tokens"]]
    return {
        **machine(), "model": str(args.model), "requests": args.requests,
        "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "stop": args.stop,
        "kv_memory_gb": args.kv_memory, "server_args": args.server_args,
        "kv_budget_bytes": budget, "prefix_cache_bound_bytes": prefix_bound,
        "statuses": statuses, "all_200": statuses == {"200": args.requests},
        "wall_s": round(wall, 2), "warm_rss_bytes": warm, "peak_rss_above_warm_bytes": peak_above,
        "target_bytes": kv_memory + MARGIN_BYTES,
        "memory_within_target": 0 < peak_above <= kv_memory + MARGIN_BYTES,
        "warm_active_bytes": warm_active,
        "peak_active_above_warm_bytes": gauges.peaks["memory_active_bytes"] - warm_active,
        "metrics_peaks": gauges.peaks, "metrics_at_peak_rss": gauges.at_peak_rss,
        "preemptions": preemptions,
        "ttft_s": {"p50": round(pct(ttft, 0.5), 3), "p95": round(pct(ttft, 0.95), 3),
                   "max": round(max(ttft), 3)} if ttft else None,
        "generated_tokens": sum(r.get("completion_tokens", 0) for r in results),
        "checked_alone": len(latest), "equal_alone": len(equal),
        "alone_cached_tokens": [alone[i].get("cached_tokens", 0) for i in latest],
        "mismatches": [{"request": i, "concurrent": results[i]["tokens"],
                        "alone": alone[i]["tokens"]} for i in latest if i not in equal],
        "errors": [r["error"] for r in results if r["status"] != 200][:5],
    }, results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--stop", action="append", help="a stop string of every request (repeatable)")
    p.add_argument("--kv-memory", type=float, default=0.5, help="the server's --kv-memory, GB")
    p.add_argument("--check", type=int, default=8,
                   help="requests (those that started last) sent again alone and compared")
    p.add_argument("--client-timeout", type=float, default=3600,
                   help="seconds a request may wait for its answer before the client gives up "
                        "(recorded as status 'timeout'); a queue of many long prompts on a slow "
                        "machine needs more")
    p.add_argument("--json")
    p.add_argument("server_args", nargs="*", help="after --: extra server flags")
    args = p.parse_args()
    report, results = run(args)
    print(json.dumps({k: v for k, v in report.items() if k != "mismatches"}, indent=2))
    if args.json:
        records = [{"status": r["status"], "ttft_s": None if r["first"] is None
                    else round(r["first"] - r["sent"], 3), "end_s": round(r["end"] - r["sent"], 3),
                    "completion_tokens": r.get("completion_tokens")} for r in results]
        Path(args.json).write_text(json.dumps({**report, "records": records}, indent=2))


if __name__ == "__main__":
    main()
