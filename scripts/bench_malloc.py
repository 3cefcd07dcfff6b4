"""glibc's malloc defaults against the thresholds ``import mlx_lm_batched`` sets.

    python scripts/bench_malloc.py --model /tmp/smollm2-f32 [--prompts 16] [--max-tokens 32] [--repeats 2]

Each run is a fresh process, as a command-line user's is: load the model, then one
``batch_generate`` of ``--prompts`` corpus prompts (log-uniform lengths in [16, 512]
tokens, all in one batch) for ``--max-tokens`` greedy tokens, with
``MLX_LM_BATCHED_MALLOC=system`` (glibc's defaults) and ``auto`` (ours), alternated
``--repeats`` times. Printed per run: wall time of the generation, its minor page faults
and its system CPU time (from ``getrusage``), and whether both settings gave the same
tokens. See ``mlx_lm_batched/_malloc.py`` for why they differ.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mlx_lm_batched import _blas, _malloc  # noqa: E402  (preloads the BLAS before mlx.core)

CHILD = r"""
import json, random, resource, sys, time
import mlx_lm_batched as mb
model_dir, corpus, n_prompts, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model, tokenizer = mb.load(model_dir)
text = open(corpus).read() * 20
rng = random.Random(0)
prompts = []
for _ in range(n_prompts):
    n = int(2 ** rng.uniform(4, 9))
    start = rng.randrange(0, len(text) - 8 * n)
    prompts.append(tokenizer.encode(text[start:start + 8 * n])[:n])
usage = lambda: resource.getrusage(resource.RUSAGE_SELF)
before, t0 = usage(), time.perf_counter()
texts = mb.batch_generate(model, tokenizer, prompts, max_tokens=max_tokens, verbose=False).texts
wall, after = time.perf_counter() - t0, usage()
print(json.dumps({"wall_s": wall, "faults": after.ru_minflt - before.ru_minflt,
                  "sys_s": after.ru_stime - before.ru_stime, "user_s": after.ru_utime - before.ru_utime,
                  "prompt_tokens": sum(map(len, prompts)), "texts": texts}))
"""


def run_once(args, choice):
    env = dict(os.environ, MLX_LM_BATCHED_MALLOC=choice, PYTHONPATH=str(REPO))
    for name in _malloc.GLIBC_ENV:
        env.pop(name, None)  # glibc's own variables would blur the comparison
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.model), str(REPO / "tests" / "data" / "corpus.txt"),
         str(args.prompts), str(args.max_tokens)],
        env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory or .gguf file")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from bench_report import machine

    print(f"{machine()}; BLAS: {_blas.describe()}; load average {os.getloadavg()[0]:.2f}")
    print(f"batch_generate of {args.prompts} prompts, {args.max_tokens} tokens each, "
          f"one fresh process per run")
    print(f"{'run':>3} {'malloc':8} {'wall s':>7} {'page faults':>12} {'sys s':>6} {'user s':>7}")
    runs = []
    for r in range(args.repeats):
        for choice in ("system", "auto"):
            got = run_once(args, choice)
            runs.append({"repeat": r, "malloc": choice, **got})
            print(f"{r:>3} {choice:8} {got['wall_s']:7.2f} {got['faults']:12d} {got['sys_s']:6.2f} "
                  f"{got['user_s']:7.2f}", flush=True)
    best = {c: min(x["wall_s"] for x in runs if x["malloc"] == c) for c in ("system", "auto")}
    same = all(x["texts"] == runs[0]["texts"] for x in runs)
    print(f"best wall: system {best['system']:.2f} s, auto {best['auto']:.2f} s "
          f"({best['system'] / best['auto']:.2f}x); same tokens in every run: {same}; "
          f"load average at end {os.getloadavg()[0]:.2f}")
    if args.json:
        for x in runs:
            x.pop("texts")
        Path(args.json).write_text(json.dumps({"machine": machine(), "blas": _blas.describe(),
                                               "prompts": args.prompts,
                                               "max_tokens": args.max_tokens,
                                               "same_tokens": same, "runs": runs}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
