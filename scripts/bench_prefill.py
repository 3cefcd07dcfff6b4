#!/usr/bin/env python
"""Prefill tokens/s side by side: ours, ours without causal key trimming, and mlx-lm.

    python scripts/bench_prefill.py --model /tmp/smollm2-f32 \\
        [--shapes 1x256,4x256,8x256,1x1024,4x1024] [--repeats 3] [--json out.json]

Each shape ``BxL`` is B distinct corpus prompts of exactly L tokens, prefilled into fresh
caches as each library's generation loop does it: ours through the batch engine
(``BatchEngine.prefill``), mlx-lm's model on its ``BatchKVCache`` as its
``BatchGenerator`` calls it (every column but the last without logits, then the last).
"untrimmed" is ours with every mask treated as a plain array, so ``cpu_ops.attention``
reads all keys for every block of queries (the attention before causal key trimming).
All three load the same weights in one process and run interleaved, best of
``--repeats`` kept; ``same``: all three sampled the same first token for every row
(greedy). The header names the CPU, the BLAS and the load average.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench_decode.py, and the working tree

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before mlx.core)
import mlx.core as mx  # noqa: E402

from bench import no_eos  # noqa: E402
from bench_decode import Ours, Theirs, equal_prompts  # noqa: E402
from bench_report import kernels, machine  # noqa: E402
from mlx_lm_batched import load  # noqa: E402
from mlx_lm_batched.layers import cpu_ops  # noqa: E402


@contextlib.contextmanager
def untrimmed():
    """``cpu_ops.attention`` recognising no mask as causal (no key trimming)."""
    saved, cpu_ops.CausalMask = cpu_ops.CausalMask, type("NoCausalMask", (), {})
    try:
        yield
    finally:
        cpu_ops.CausalMask = saved


class OursUntrimmed(Ours):
    name = "untrimmed"

    def prefill(self):
        with untrimmed():
            super().prefill()


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        batch, length = item.lower().split("x")
        shapes.append((int(batch), int(length)))
    return shapes


def time_prefill(sides, repeats):
    """Best prefill seconds of each side, the sides interleaved in every repeat."""
    times = {s.name: [] for s in sides}
    for _ in range(repeats):
        for s in sides:
            mx.synchronize()
            tic = time.perf_counter()
            s.prefill()
            times[s.name].append(time.perf_counter() - tic)
    return {name: min(t) for name, t in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="/tmp/smollm2-f32")
    p.add_argument("--shapes", default="1x256,4x256,8x256,1x1024,4x1024")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args(argv)
    import mlx_lm

    model, tokenizer = load(args.model)
    tokenizer = no_eos(tokenizer)
    ref, _ = mlx_lm.load(args.model)
    load_start = os.getloadavg()
    print(f"{machine()}; BLAS: {kernels()}; load average {load_start[0]:.2f}; "
          f"best of {args.repeats} interleaved")
    print(f"{'shape':>7s} {'ours t/s':>9s} {'untrimmed':>9s} {'mlx-lm':>8s} "
          f"{'ours/untrimmed':>14s} {'ours/mlx-lm':>11s} {'same':>5s}")
    rows = []
    for batch, length in parse_shapes(args.shapes):
        prompts = equal_prompts(tokenizer, batch, length)
        sides = [Ours(model, prompts), OursUntrimmed(model, prompts), Theirs(ref, prompts)]
        best = time_prefill(sides, args.repeats)
        tps = {name: batch * length / t for name, t in best.items()}
        # Every side's first sampled token of each row (greedy): the same work was done.
        first = [s.y.tolist() for s in sides]
        same = all(f == first[0] for f in first)
        row = {"batch": batch, "length": length, "ours_tps": tps["ours"],
               "untrimmed_tps": tps["untrimmed"], "mlx_tps": tps["mlx-lm"],
               "same_first_tokens": same}
        rows.append(row)
        print(f"{batch:>3d}x{length:<3d} {tps['ours']:9.0f} {tps['untrimmed']:9.0f} "
              f"{tps['mlx-lm']:8.0f} {tps['ours'] / tps['untrimmed']:14.2f} "
              f"{tps['ours'] / tps['mlx-lm']:11.2f} {str(same):>5s}", flush=True)
    load_end = os.getloadavg()
    print(f"load average at end {load_end[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine(), "blas": kernels(), "load_start": load_start,
            "load_end": load_end, "repeats": args.repeats, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
