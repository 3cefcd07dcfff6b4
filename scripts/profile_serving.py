#!/usr/bin/env python
"""Where a serving engine step's time goes, without HTTP: the fixed serving workload of
``bench_server.py --fixed-len`` (``C`` closed-loop streams, prompts of ``P`` tokens,
``O`` output tokens each) driven straight through ``BatchGenerator`` with the server's
settings, one ``next()`` per engine step as the server's engine thread does.

    python scripts/profile_serving.py --model DIR [--fixed-len 256 64] [--concurrency 16]
        [--requests-per-stream 3] [--prefill-step-size 2048] [--profile]

Prints output tokens/s, TTFT and inter-token p50/p95 (per row, from its own token times),
then the steps by kind: decode only, decode + a prefill call, prefill only (nothing
decoding), with their count and time. ``--profile`` adds the top functions by their own
time (cProfile) over the whole run: model calls show as MLX's ``eval``/``tolist``/``item``,
Python per step as the scheduler's functions.
"""

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx_lm_batched  # noqa: E402,F401  (loads the CPU BLAS before mlx.core)
import numpy as np  # noqa: E402

from bench_report import machine  # noqa: E402
from mlx_lm_batched import load  # noqa: E402
from mlx_lm_batched.sched.generator import BatchGenerator  # noqa: E402


def prompts_for(tokenizer, n, length, seed=0):
    """``n`` different prompts of exactly ``length`` token ids (random ordinary tokens)."""
    rng = np.random.default_rng(seed)
    vocab = len(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out = []
    for _ in range(n):
        ids = [int(t) for t in rng.integers(100, vocab - 1, size=length) if t not in special]
        while len(ids) < length:
            ids.append(1000 + len(ids))
        out.append(ids[:length])
    return out


def run(model, tokenizer, args):
    """Drive the closed loop; returns (per-request records, per-step records, wall s)."""
    c, (plen, olen) = args.concurrency, args.fixed_len
    total = c * args.requests_per_stream
    prompts = prompts_for(tokenizer, total, plen)
    gen = BatchGenerator(model, max_tokens=olen, completion_batch_size=args.max_batch,
                         prefill_batch_size=args.prefill_batch,
                         prefill_step_size=args.prefill_step_size, stop_tokens=[],
                         return_logprobs=False, return_caches=False)
    sent, requests, steps = 0, {}, []

    def submit(now):
        nonlocal sent
        (uid,) = gen.insert([prompts[sent]], max_tokens=[olen])
        requests[uid] = {"sent": now, "tokens": []}
        sent += 1

    start = time.perf_counter()
    for _ in range(c):
        submit(start)
    finished = 0
    while finished < total:
        tic = time.perf_counter()
        prompt_responses, responses = gen.next()
        now = time.perf_counter()
        steps.append((now - tic, bool(prompt_responses), len(responses)))
        for r in responses:
            requests[r.uid]["tokens"].append(now)
            if r.finish_reason is not None:
                finished += 1
                if sent < total:
                    submit(now)
    return requests, steps, time.perf_counter() - start


def summarize(requests, steps, wall, olen):
    ttft = [r["tokens"][0] - r["sent"] for r in requests.values()]
    itl = [b - a for r in requests.values() for a, b in zip(r["tokens"], r["tokens"][1:])]
    tokens = sum(len(r["tokens"]) for r in requests.values())
    print(f"output tok/s {tokens / wall:.1f}  ({len(requests)} requests, {tokens} tokens, "
          f"{wall:.1f} s)")
    print(f"TTFT p50 {np.percentile(ttft, 50):.2f} s  p95 {np.percentile(ttft, 95):.2f} s;  "
          f"inter-token p50 {1000 * np.percentile(itl, 50):.0f} ms  "
          f"p95 {1000 * np.percentile(itl, 95):.0f} ms")
    kinds = {"decode only": [], "decode + prefill call": [], "prefill only": []}
    for dt, prefilled, decoded in steps:
        key = ("decode + prefill call" if decoded else "prefill only") if prefilled else \
            "decode only"
        kinds[key].append(dt)
    for key, times in kinds.items():
        if times:
            print(f"  {key:22s} {len(times):5d} steps  {sum(times):7.1f} s  "
                  f"median {1000 * np.median(times):6.0f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--fixed-len", type=int, nargs=2, default=(256, 64), metavar=("P", "O"))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests-per-stream", type=int, default=3)
    p.add_argument("--max-batch", type=int, default=64, help="the server's --max-batch")
    p.add_argument("--prefill-batch", type=int, default=8, help="the server's --prefill-batch")
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    model, tokenizer = load(args.model)
    print(machine())
    print(f"{args.concurrency} streams, prompts {args.fixed_len[0]}, outputs "
          f"{args.fixed_len[1]}, prefill step {args.prefill_step_size}")
    warm = argparse.Namespace(**{**vars(args), "concurrency": 1, "requests_per_stream": 1,
                                 "fixed_len": (16, 4)})
    run(model, tokenizer, warm)
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    requests, steps, wall = run(model, tokenizer, args)
    if profiler:
        profiler.disable()
    summarize(requests, steps, wall, args.fixed_len[1])
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
