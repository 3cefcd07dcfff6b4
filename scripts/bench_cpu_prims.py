#!/usr/bin/env python
"""Our CPU primitives (``mlx_lm_batched/_cpu_prims.py``) against MLX's own ops, in one
process, interleaved.

    python scripts/bench_cpu_prims.py --model /tmp/smollm2-f32 [--batch-sizes 8,16]
        [--prompt-len 256] [--steps 24] [--repeats 3]
        [--attention 16x463,8x300] [--json out.json]

- ``forward``: one decode step of our batch engine (model call and ``mx.eval`` of the
  logits, median over ``--steps``, best over ``--repeats``) with the primitives and with
  ``_cpu_prims.switched_off()``, and the step's graph node count both ways;
- ``attention``: 30 layers' decode attention alone (``cpu_ops.attention`` on random
  float32 queries, keys and values of SmolLM2's shape: 9 query heads, 3 KV heads, 64
  features) at each ``ROWSxSLOTS``, both ways, best of ``--repeats`` x 5.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before mlx.core)
import mlx.core as mx  # noqa: E402

from bench_decode import Ours, equal_prompts, time_forward  # noqa: E402
from bench_report import kernels, machine  # noqa: E402
from mlx_lm_batched import _cpu_prims, load  # noqa: E402
from mlx_lm_batched.layers import cpu_ops  # noqa: E402


class OpsSide(Ours):
    """Our decode step with MLX's ops instead of the primitives."""

    name = "ops"

    def forward(self):
        with _cpu_prims.switched_off():
            super().forward()


def graph_nodes(side):
    """Nodes of one decode step's graph (``mx.export_to_dot``), not evaluated."""
    e = side.engine
    logits = side.model(side.y[:, None], offset=e.offset, cache=e.cache)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "step.dot")
        mx.export_to_dot(path, logits)
        labels = re.findall(r'label ?= ?"([^"]*)"', Path(path).read_text())
    return sum(1 for label in labels if not label.startswith(("array", "(")))


def time_attention(rows, slots, repeats, layers=30):
    """Best seconds of ``layers`` decode attention calls, primitives then MLX's ops."""
    keys = [mx.random.key(i) for i in range(3)]
    qs = [mx.random.normal((rows, 9, 1, 64), key=keys[0]) for _ in range(layers)]
    ks = [mx.random.normal((rows, 3, slots, 64), key=keys[1]) + i for i in range(layers)]
    vs = [mx.random.normal((rows, 3, slots, 64), key=keys[2]) - i for i in range(layers)]
    mask = mx.ones((rows, 1, 1, slots), dtype=mx.bool_)
    mx.eval(qs, ks, vs, mask)

    def run():
        mx.eval([cpu_ops.attention(q, k, v, 0.125, mask) for q, k, v in zip(qs, ks, vs)])

    out = {"prims": [], "ops": []}
    for _ in range(repeats * 5):
        for name in out:
            tic = time.perf_counter()
            if name == "ops":
                with _cpu_prims.switched_off():
                    run()
            else:
                run()
            out[name].append(time.perf_counter() - tic)
    return {k: min(v) for k, v in out.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch-sizes", default="8,16")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attention", default="16x463,8x300")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if _cpu_prims.module() is None:
        sys.exit(f"bench_cpu_prims: {_cpu_prims.describe()}")
    load_start = os.getloadavg()
    print(f"{machine()}; BLAS: {kernels()}; load average {load_start[0]:.2f}")
    model, tokenizer = load(args.model)
    result = {"machine": machine(), "blas": kernels(), "load_start": load_start,
              "forward": [], "attention": []}
    print(f"{'bs':>3s} {'prims ms':>9s} {'ops ms':>7s} {'x':>5s} {'nodes':>6s} {'ops nodes':>9s}")
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = equal_prompts(tokenizer, bs, args.prompt_len)
        sides = [Ours(model, prompts), OpsSide(model, prompts)]
        fwd, _ = time_forward(sides, args.steps, args.repeats)
        nodes = graph_nodes(sides[0])
        with _cpu_prims.switched_off():
            ops_nodes = graph_nodes(sides[1])
        row = dict(bs=bs, prims_ms=fwd["ours"] * 1e3, ops_ms=fwd["ops"] * 1e3,
                   nodes=nodes, ops_nodes=ops_nodes)
        result["forward"].append(row)
        print(f"{bs:3d} {row['prims_ms']:9.1f} {row['ops_ms']:7.1f} "
              f"{fwd['ops'] / fwd['ours']:5.2f} {nodes:6d} {ops_nodes:9d}", flush=True)
    print(f"{'attention (30 layers)':>22s} {'prims ms':>9s} {'ops ms':>7s} {'x':>5s}")
    for case in filter(None, args.attention.split(",")):
        rows, slots = (int(x) for x in case.split("x"))
        t = time_attention(rows, slots, args.repeats)
        result["attention"].append(dict(rows=rows, slots=slots, prims_ms=t["prims"] * 1e3,
                                        ops_ms=t["ops"] * 1e3))
        print(f"{case:>22s} {t['prims'] * 1e3:9.1f} {t['ops'] * 1e3:7.1f} "
              f"{t['ops'] / t['prims']:5.2f}", flush=True)
    result["load_end"] = os.getloadavg()
    print(f"load average at end {result['load_end'][0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
