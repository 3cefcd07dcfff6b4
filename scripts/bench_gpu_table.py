#!/usr/bin/env python
"""One table, ours against mlx-lm, from the JSON of ``bench.py`` and of ``bench_server.py
--concurrency`` (what ``bench_gpu.sh`` runs on a GPU machine).

    python scripts/bench_gpu_table.py [--bench bench.json] [--server server.json]

Rows: prefill, decode and end-to-end tokens/s and peak memory of ``batch_generate``
against mlx-lm's batch generator per batch size (the best repeat of each); output
tokens/s, time to first token p95 and inter-token latency p50 of the two servers per
number of concurrent streams. ``ours/mlx-lm`` > 1 means ours is faster (for the latency
rows: ours takes longer).
"""

import argparse
import json
import sys
from pathlib import Path


def bench_rows(out):
    """``(what, ours, mlx-lm)`` rows of a ``bench.py`` result."""
    rows = {(r["config"], r["batch_size"]): r for r in out["rows"]}
    sizes = sorted({bs for config, bs in rows if config == "ours"})
    for bs in sizes:
        ours, theirs = rows[("ours", bs)], rows.get(("mlx-lm", bs), {})
        yield f"prefill tok/s, batch {bs}", ours["prompt_tps"], theirs.get("prompt_tps")
        yield f"decode tok/s, batch {bs}", ours["gen_tps"], theirs.get("gen_tps")
        yield f"end-to-end tok/s, batch {bs}", ours["e2e_tps"], theirs.get("e2e_tps")
        yield f"peak memory GB, batch {bs}", ours["peak_gb"], theirs.get("peak_gb")


def server_rows(out):
    """``(what, ours, mlx-lm)`` rows of a ``bench_server.py --concurrency`` result."""
    if out.get("mode") != "concurrency":
        raise ValueError("--server: expected the JSON of bench_server.py --concurrency")
    for level in out["levels"]:
        c, results = level["concurrency"], level["results"]
        ours, theirs = results.get("ours", {}), results.get("mlx-lm", {})
        streams = f"{c} stream{'s' if c > 1 else ''}"
        yield f"server output tok/s, {streams}", ours.get("output_tps"), theirs.get("output_tps")
        yield f"server TTFT p95 s, {streams}", ours.get("ttft_p95_s"), theirs.get("ttft_p95_s")
        yield f"server ITL p50 ms, {streams}", ours.get("itl_p50_ms"), theirs.get("itl_p50_ms")


def print_table(bench=None, server=None, file=sys.stdout):
    """The header (machine, workloads) and one row per measurement."""
    for out, what in ((bench, "bench.py"), (server, "bench_server.py")):
        if out is not None:
            print(f"{what}: {out['model']} on {out['machine']}", file=file)
    if bench is not None:
        print(f"  batch_generate: {bench['prompts']} prompts of {min(bench['prompt_lengths'])}-"
              f"{max(bench['prompt_lengths'])} tokens, {bench['max_tokens']} new tokens each, "
              f"best of {bench['repeats']}", file=file)
    if server is not None:
        print(f"  servers: prompts {server['prompt_len'][0]} tokens, outputs "
              f"{server['output_len'][0]} tokens, {server['requests_per_stream']} requests "
              f"per stream, streamed /v1/completions", file=file)
    rows = list(bench_rows(bench) if bench is not None else []) + \
        list(server_rows(server) if server is not None else [])
    print(f"{'':34} {'ours':>10} {'mlx-lm':>10} {'ours/mlx-lm':>12}", file=file)
    for what, ours, theirs in rows:
        cell = lambda v: f"{v:10.2f}" if v is not None else f"{'-':>10}"  # noqa: E731
        ratio = f"{ours / theirs:12.2f}" if ours is not None and theirs else f"{'-':>12}"
        print(f"{what:34} {cell(ours)} {cell(theirs)} {ratio}", file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", default=None, help="JSON written by bench.py --json")
    p.add_argument("--server", default=None, help="JSON written by bench_server.py --json")
    args = p.parse_args(argv)
    if not (args.bench or args.server):
        p.error("give --bench, --server or both")
    load = lambda path: json.loads(Path(path).read_text()) if path else None  # noqa: E731
    try:
        print_table(load(args.bench), load(args.server))
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
