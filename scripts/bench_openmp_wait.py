#!/usr/bin/env python
"""Our kernels' OpenMP threads sleeping, spinning and spinning briefly, on shared cores.

    python scripts/bench_openmp_wait.py --model DIR_OR_GGUF [--processes 2] [--rows 8]
        [--prompt-tokens 400] [--tokens 48] [--brief-spin 1000] [--json out.json]

Each side runs ``--processes`` copies of one workload at once (a batch of ``--rows``
greedy rows of ``--prompt-tokens`` corpus tokens, ``--tokens`` generated each, timed
after a warm-up) and then one copy alone, in fresh processes:

- ``sleeping``: ``OMP_WAIT_POLICY=passive``, a thread sleeps as soon as it has nothing to
  do (the package's default from 0.6.0 to 0.8.3);
- ``spinning``: libgomp's own default, restored with ``OMP_WAIT_POLICY=active
  GOMP_SPINCOUNT=300000`` (its spin count when nothing is set);
- ``brief spin`` (with ``--brief-spin N``): ``OMP_WAIT_POLICY=active GOMP_SPINCOUNT=N``,
  a thread spins N rounds (about N / 100 microseconds by libgomp's estimate) for the next
  parallel region before it sleeps (the package's default from 0.8.4 is N = 1000, see
  ``mlx_lm_batched._native_build``).

Prints a table of the wall times (the slowest of the concurrent copies) and each side's
ratio to sleeping (above 1: that side is slower).
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
    "sleeping": {"OMP_WAIT_POLICY": "passive"},
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
    ap.add_argument("--model", required=True,
                    help="model directory (float32 SmolLM2 in the docs) or GGUF file")
    ap.add_argument("--processes", type=int, default=2, help="copies run at once")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--brief-spin", type=int, metavar="N",
                    help="also run with GOMP_SPINCOUNT=N (a brief spin before sleeping)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if not (os.path.isdir(args.model) or (args.model.endswith(".gguf")
                                          and os.path.isfile(args.model))):
        sys.exit(f"error: --model {args.model}: not a directory or a .gguf file")
    sides = dict(SIDES)
    if args.brief_spin is not None:
        if args.brief_spin < 0:
            sys.exit(f"error: --brief-spin {args.brief_spin}: a spin count of 0 or more")
        sides[f"brief spin ({args.brief_spin})"] = {"OMP_WAIT_POLICY": "active",
                                                    "GOMP_SPINCOUNT": str(args.brief_spin)}

    results = {"model": args.model, "processes": args.processes, "rows": args.rows,
               "prompt_tokens": args.prompt_tokens, "tokens": args.tokens,
               "load_average_before": os.getloadavg(), "sides": {}}
    for name, env in sides.items():
        concurrent = run_copies(args, env, args.processes)
        alone = run_copies(args, env, 1)
        results["sides"][name] = {"concurrent_s": concurrent, "alone_s": alone[0]}
    results["load_average_after"] = os.getloadavg()
    results["date"] = time.strftime("%Y-%m-%d")

    names = list(results["sides"])
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, key in ((f"{args.processes} processes at once (slowest)", "concurrent_s"),
                       ("one process alone", "alone_s")):
        times = [max(results["sides"][n][key]) if key == "concurrent_s"
                 else results["sides"][n][key] for n in names]
        cells = [f"{t:.1f} s" + ("" if i == 0 else f" ({t / times[0]:.2f}x)")
                 for i, t in enumerate(times)]
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
