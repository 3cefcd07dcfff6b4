#!/usr/bin/env python
"""Our kernels' OpenMP threads sleeping (the default) against spinning, on shared cores.

    python scripts/bench_openmp_wait.py --model DIR [--processes 2] [--rows 8]
        [--prompt-tokens 400] [--tokens 48] [--json out.json]

Each side runs ``--processes`` copies of one workload at once (a batch of ``--rows``
greedy rows of ``--prompt-tokens`` corpus tokens, ``--tokens`` generated each, timed
after a warm-up) and then one copy alone, in fresh processes:

- ``sleeping``: the package's default (``OMP_WAIT_POLICY`` unset: the kernels' libgomp
  is loaded with ``passive``, see ``mlx_lm_batched._native_build``);
- ``spinning``: libgomp's own default, restored with ``OMP_WAIT_POLICY=active
  GOMP_SPINCOUNT=300000`` (its spin count when nothing is set).

Prints a table of the wall times (the slowest of the concurrent copies) and their ratio.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SIDES = {
    "sleeping": {},
    "spinning": {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "300000"},
}

WORKLOAD = """
import sys, time
sys.path[:0] = [{here!r}, {root!r}]
from bench import build_prompts, no_eos
from mlx_lm_batched import batch_generate, load
model, tokenizer = load({model!r})
tokenizer = no_eos(tokenizer)
prompts = build_prompts(tokenizer, {rows}, min_len={length}, max_len={length})
batch_generate(model, tokenizer, prompts[:2], max_tokens=4)
tic = time.perf_counter()
batch_generate(model, tokenizer, prompts, max_tokens={tokens})
print(time.perf_counter() - tic)
"""


def run_copies(args, env_extra, copies):
    """Wall seconds of each of ``copies`` processes started at once."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(env_extra)
    code = WORKLOAD.format(here=HERE, root=ROOT, model=args.model, rows=args.rows,
                           length=args.prompt_tokens, tokens=args.tokens)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(copies)]
    times = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"error: a workload process failed:\n{err.strip()}")
        times.append(float(out.strip().splitlines()[-1]))
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory (float32 SmolLM2 in the docs)")
    ap.add_argument("--processes", type=int, default=2, help="copies run at once")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.model):
        sys.exit(f"error: --model {args.model}: not a directory")

    results = {"processes": args.processes, "rows": args.rows,
               "prompt_tokens": args.prompt_tokens, "tokens": args.tokens,
               "load_average_before": os.getloadavg(), "sides": {}}
    for name, env in SIDES.items():
        concurrent = run_copies(args, env, args.processes)
        alone = run_copies(args, env, 1)
        results["sides"][name] = {"concurrent_s": concurrent, "alone_s": alone[0]}
    results["load_average_after"] = os.getloadavg()
    results["date"] = time.strftime("%Y-%m-%d")

    sleep, spin = results["sides"]["sleeping"], results["sides"]["spinning"]
    print(f"| | sleeping | spinning | sleeping / spinning |")
    print(f"|---|---|---|---|")
    for label, key in ((f"{args.processes} processes at once (slowest)", "concurrent_s"),
                       ("one process alone", "alone_s")):
        a = max(sleep[key]) if isinstance(sleep[key], list) else sleep[key]
        b = max(spin[key]) if isinstance(spin[key], list) else spin[key]
        print(f"| {label} | {a:.1f} s | {b:.1f} s | {a / b:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
