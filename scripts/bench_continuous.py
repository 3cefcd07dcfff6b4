#!/usr/bin/env python
"""Continuous batching under a seeded arrival trace: ours vs mlx-lm vs static batches.

    python scripts/bench_continuous.py --model /tmp/smollm2-f32 [--requests 64] [--rate 1.0]
        [--prompt-len 16 512] [--output-len 16 256] [--seed 0] [--systems ours,mlx-lm,static]
        [--json out.json] [--plot out.png]

One trace (Poisson arrivals at ``--rate`` requests/s, prompt and output lengths uniform in
the given ranges, prompts cut from tests/data/corpus.txt) is replayed in one process
through, one after the other:

- ``ours``: this package's ``BatchGenerator`` (rows join the running batch as they arrive);
- ``mlx-lm``: mlx-lm's ``BatchGenerator`` on the same weights (when mlx-lm is installed);
- ``static``: this package's ``stream_batch_generate`` over arrival windows: whatever has
  arrived when the previous batch ends runs as the next batch, to completion.

Every request generates exactly its output length greedily (no EOS stop on any side), so
all systems do the same work; outputs are compared with ``static`` (``=static``: share of
requests with identical tokens). Reported per system: requests/s and output tokens/s over
the whole replay, time to first token (arrival to first token) p50/p95 and inter-token
latency p50/p95.
"""

import argparse
import json
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before anything imports mlx.core)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from bench import build_prompts, load_mlx_lm, no_eos, resolve_model_dir  # noqa: E402
from bench_report import machine  # noqa: E402
from mlx_lm_batched import load  # noqa: E402

SYSTEMS = ("ours", "mlx-lm", "static")


def make_trace(tokenizer, n, rate, prompt_len, output_len, seed):
    """``n`` requests: arrival time (s), token prompt, output length; seeded."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(t)
        t += rng.expovariate(rate)
    lengths = [rng.randint(*prompt_len) for _ in range(n)]
    outputs = [rng.randint(*output_len) for _ in range(n)]
    prompts = []
    for length in lengths:  # build_prompts draws lengths itself: cut each at its own length
        prompts.append(build_prompts(tokenizer, 1, seed=rng.randrange(1 << 30),
                                     min_len=length, max_len=length)[0])
    return [{"arrival": a, "prompt": p, "max_tokens": m}
            for a, p, m in zip(arrivals, prompts, outputs)]


def replay_generator(gen, trace):
    """Feed ``trace`` to a BatchGenerator-like object in real time; per-request token times."""
    times = [[] for _ in trace]
    tokens = [[] for _ in trace]
    pending = deque(range(len(trace)))
    row = {}
    active = 0
    start = time.perf_counter()
    while pending or active:
        now = time.perf_counter() - start
        arrived = []
        while pending and trace[pending[0]]["arrival"] <= now:
            arrived.append(pending.popleft())
        if arrived:
            uids = gen.insert([trace[i]["prompt"] for i in arrived],
                              [trace[i]["max_tokens"] for i in arrived])
            row.update(zip(uids, arrived))
            active += len(arrived)
        if not active:
            time.sleep(max(0.0, trace[pending[0]]["arrival"] - now))
            continue
        _, responses = gen.next()
        t = time.perf_counter() - start
        for r in responses:
            i = row[r.uid]
            times[i].append(t)
            tokens[i].append(r.token)
            if r.finish_reason is not None:
                active -= 1
    return times, tokens


def replay_static(model, tokenizer, trace, batch_size):
    """Arrival windows: everything that has arrived runs as one batch, to completion."""
    from mlx_lm_batched.generate import stream_batch_generate

    times = [[] for _ in trace]
    tokens = [[] for _ in trace]
    pending = deque(range(len(trace)))
    start = time.perf_counter()
    while pending:
        now = time.perf_counter() - start
        if trace[pending[0]]["arrival"] > now:
            time.sleep(trace[pending[0]]["arrival"] - now)
            continue
        window = []
        while pending and trace[pending[0]]["arrival"] <= now:
            window.append(pending.popleft())
        for r in stream_batch_generate(model, tokenizer, [trace[i]["prompt"] for i in window],
                                       [trace[i]["max_tokens"] for i in window],
                                       completion_batch_size=batch_size, logprobs=False):
            i = window[r.index]
            times[i].append(time.perf_counter() - start)
            tokens[i].append(r.token)
    return times, tokens


def summarize(trace, times):
    ttft = [t[0] - r["arrival"] for r, t in zip(trace, times)]
    itl = [b - a for t in times for a, b in zip(t, t[1:])]
    end = max(t[-1] for t in times)
    generated = sum(len(t) for t in times)
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else 0.0  # noqa: E731
    return {
        "wall_s": end, "requests_per_s": len(trace) / end, "output_tps": generated / end,
        "generated": generated,
        "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95),
        "itl_p50_ms": 1e3 * pct(itl, 50), "itl_p95_ms": 1e3 * pct(itl, 95),
    }


def run(args):
    path = resolve_model_dir(args.model)
    model, tokenizer = load(path)
    tokenizer = no_eos(tokenizer)
    trace = make_trace(tokenizer, args.requests, args.rate, args.prompt_len, args.output_len,
                       args.seed)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"error: unknown --systems {sorted(unknown)}; choose from {SYSTEMS}")
    results, outputs = {}, {}
    for name in systems:
        mx.clear_cache()
        if name == "ours":
            from mlx_lm_batched.generate import BatchGenerator

            gen = BatchGenerator(model, stop_tokens=None, completion_batch_size=args.batch_size)
            times, toks = replay_generator(gen, trace)
            gen.close()
        elif name == "mlx-lm":
            theirs = load_mlx_lm(path)
            if theirs is None:
                print("mlx-lm is not installed: skipping its column", file=sys.stderr)
                continue
            from mlx_lm.generate import BatchGenerator as TheirGenerator

            gen = TheirGenerator(theirs, stop_tokens=None, completion_batch_size=args.batch_size)
            times, toks = replay_generator(gen, trace)
            gen.close()
            del theirs, gen
        else:
            times, toks = replay_static(model, tokenizer, trace, args.batch_size)
        results[name], outputs[name] = summarize(trace, times), toks
    reference = outputs.get("static") or next(iter(outputs.values()))
    for name, toks in outputs.items():
        results[name]["equal_to_static"] = sum(a == b for a, b in zip(toks, reference)) / len(trace)
    from mlx_lm_batched import _blas

    blas = getattr(_blas, "describe", lambda: str(_blas.loaded_path or "bundled"))()
    return {
        "model": str(args.model), "machine": machine(), "blas": blas,
        "requests": args.requests, "rate": args.rate, "seed": args.seed,
        "prompt_len": list(args.prompt_len), "output_len": list(args.output_len),
        "batch_size": args.batch_size, "results": results,
    }


def print_table(out, file=sys.stdout):
    print(f"model {out['model']} ({out['machine']}; BLAS: {out['blas']})", file=file)
    print(f"{out['requests']} requests, Poisson {out['rate']}/s, prompts {out['prompt_len'][0]}-"
          f"{out['prompt_len'][1]} tokens, outputs {out['output_len'][0]}-{out['output_len'][1]}, "
          f"seed {out['seed']}, batch size {out['batch_size']}", file=file)
    head = (f"{'system':8} {'req/s':>6} {'out t/s':>8} {'TTFT p50':>9} {'TTFT p95':>9} "
            f"{'ITL p50':>8} {'ITL p95':>8} {'x mlx-lm':>8} {'=static':>8}")
    print(head, file=file)
    base = out["results"].get("mlx-lm", {}).get("output_tps")
    for name, r in out["results"].items():
        ratio = f"{r['output_tps'] / base:8.2f}" if base else f"{'':8}"
        print(f"{name:8} {r['requests_per_s']:6.2f} {r['output_tps']:8.1f} {r['ttft_p50_s']:8.2f}s "
              f"{r['ttft_p95_s']:8.2f}s {r['itl_p50_ms']:6.0f}ms {r['itl_p95_ms']:6.0f}ms {ratio} "
              f"{100 * r['equal_to_static']:7.0f}%", file=file)


def plot(out, path, what="throughput", who=""):
    """Two panels: output tokens/s per system; TTFT p50/p95 per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out["results"])
    res = [out["results"][n] for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [r["output_tps"] for r in res], color="tab:blue")
    a.set_ylabel("output tokens/s")
    a.set_title(what)
    x = np.arange(len(names))
    b.bar(x - 0.2, [r["ttft_p50_s"] for r in res], 0.4, label="p50")
    b.bar(x + 0.2, [r["ttft_p95_s"] for r in res], 0.4, label="p95")
    b.set_xticks(x, names)
    b.set_ylabel("seconds")
    b.set_title("time to first token")
    b.legend()
    fig.suptitle(f"{who}{out['requests']} requests, Poisson {out['rate']}/s ({out['machine']})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def trace_parser(description, model_help, batch_help):
    """The arguments both arrival-trace benchmarks take (this one and bench_server.py)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rate", type=float, default=1.0, help="mean arrivals per second")
    p.add_argument("--prompt-len", type=int, nargs=2, default=[16, 512], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    p.add_argument("--batch-size", type=int, default=32, help=batch_help)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    return p


def check_trace_args(p, args):
    """One clear error for a count, rate or length that is not positive."""
    if args.requests < 1 or args.rate <= 0 or args.batch_size < 1 or \
            min(args.prompt_len + args.output_len) < 1:
        p.error("--requests, --rate, --batch-size and the lengths must be positive")


def report(out, args, print_table, plot):
    """The table on stdout, then the JSON and the plot where asked."""
    print_table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        plot(out, args.plot)


def main(argv=None):
    p = trace_parser(__doc__.splitlines()[0], "model directory or .gguf (converted to float32)",
                     "completion batch size (all systems)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    args = p.parse_args(argv)
    check_trace_args(p, args)
    report(run(args), args, print_table, plot)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
