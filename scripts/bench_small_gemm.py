#!/usr/bin/env python
"""The small-row matmul kernel against the BLAS, in one process, interleaved.

    python scripts/bench_small_gemm.py --model /tmp/smollm2-f32 [--rows 1,4,8,16,32,64]
        [--batch-sizes 16,32,64] [--repeats 9] [--json out.json]

Two measurements, each switching the kernel's row limit (``_small_gemm.set_max_rows``)
back and forth so both sides see the same machine load:

- ``products``: every projection of the model and its LM head (``x @ W.T``, the model's
  own float32 weights) for ``x`` of each row count, once with the kernel and once with
  the BLAS; weights streamed per second and GFLOP/s (median of ``--repeats``).
- ``steps``: a real batched decode step (``BatchEngine``, synchronised) at each batch
  size with the row limit at 8 (the default before 0.2.0: the projections go to
  the BLAS, attention's few-row products to the kernel) and at the batch size (all of
  them to the kernel).

Linux with a BLAS loaded by ``mlx_lm_batched._blas`` and a C compiler only (where the
kernel is built); elsewhere it says so and exits 1.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench.py, and the working tree's package

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before mlx.core)
import mlx.core as mx  # noqa: E402

from bench import build_prompts  # noqa: E402
from bench_report import machine  # noqa: E402
from mlx_lm_batched import _blas, _small_gemm, load  # noqa: E402
from mlx_lm_batched.engine.batch_engine import BatchEngine  # noqa: E402
from mlx_lm_batched.engine.prefill_plan import left_pad  # noqa: E402
from profile_decode import head_module, linear_weights  # noqa: E402


def median(values):
    return sorted(values)[len(values) // 2]


def interleaved(sides, repeats):
    """Median seconds of each ``fn`` in ``sides`` ({name: (row_limit, fn)}), alternated."""
    times = {name: [] for name in sides}
    for limit, fn in sides.values():  # warm up both
        _small_gemm.set_max_rows(limit)
        fn()
    for _ in range(repeats):
        for name, (limit, fn) in sides.items():
            _small_gemm.set_max_rows(limit)
            tic = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - tic)
    return {name: median(t) for name, t in times.items()}


def products(model, rows_list, repeats):
    weights = [child.weight for _, child in linear_weights(model)] + [head_module(model).weight]
    weights = [w.astype(mx.float32) for w in weights]
    mx.eval(weights)
    nbytes = sum(w.nbytes for w in weights)
    out = []
    for rows in rows_list:
        xs = {w.shape[1]: mx.random.normal((rows, w.shape[1])) for w in weights}
        mx.eval(list(xs.values()))

        def multiply():
            return [xs[w.shape[1]] @ w.T for w in weights]

        limits = {"kernel": max(rows, 1), "blas": 0}
        t = interleaved({name: (limit, lambda: mx.eval(multiply()))
                         for name, limit in limits.items()}, repeats)
        # Both sides must compute the same products (to float32 rounding).
        results = {}
        for name, limit in limits.items():
            _small_gemm.set_max_rows(limit)
            results[name] = multiply()
            mx.eval(results[name])
        diff = max((mx.abs(a - b).max() / mx.maximum(mx.abs(b).max(), 1e-30)).item()
                   for a, b in zip(results["kernel"], results["blas"]))
        flops = 2 * rows * nbytes / 4
        out.append({"rows": rows, **{f"{k}_ms": v * 1e3 for k, v in t.items()},
                    "kernel_gbs": nbytes / t["kernel"] / 1e9, "blas_gbs": nbytes / t["blas"] / 1e9,
                    "kernel_gflops": flops / t["kernel"] / 1e9,
                    "blas_gflops": flops / t["blas"] / 1e9, "blas_over_kernel": t["blas"] / t["kernel"],
                    "max_relative_difference": diff})
        r = out[-1]
        print(f"  rows {rows:3d}  kernel {r['kernel_ms']:7.1f} ms ({r['kernel_gbs']:5.1f} GB/s, "
              f"{r['kernel_gflops']:6.1f} GFLOP/s)  BLAS {r['blas_ms']:7.1f} ms "
              f"({r['blas_gbs']:5.1f} GB/s, {r['blas_gflops']:6.1f} GFLOP/s)  "
              f"BLAS/kernel {r['blas_over_kernel']:.2f}  max diff {diff:.1e}", flush=True)
    return out


def steps(model, tokenizer, batch_sizes, repeats, steps_per_sample=4):
    out = []
    for batch in batch_sizes:
        tokens, padding = left_pad(sorted(build_prompts(tokenizer, batch, seed=0), key=len))
        engine = BatchEngine(model)
        engine.sampling.want_logprobs = False
        engine.reserve(steps_per_sample * (repeats + 1) * 2 + 8)
        y, _ = engine.prefill(tokens, padding)
        mx.eval(y)
        state = {"y": y}

        def run():
            for _ in range(steps_per_sample):
                state["y"], _ = engine.step(state["y"])
                mx.eval(state["y"])
                state["y"].tolist()

        t = interleaved({"limit_8": (8, run), "limit_batch": (batch, run)}, repeats)
        r = {"batch": batch, "limit_8_ms": t["limit_8"] / steps_per_sample * 1e3,
             "limit_batch_ms": t["limit_batch"] / steps_per_sample * 1e3,
             "ratio": t["limit_8"] / t["limit_batch"]}
        out.append(r)
        print(f"  batch {batch:3d}  step, limit 8 {r['limit_8_ms']:7.1f} ms  limit {batch} "
              f"{r['limit_batch_ms']:7.1f} ms  ratio {r['ratio']:.2f}", flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="/tmp/smollm2-f32")
    p.add_argument("--rows", default="1,4,8,16,32,64")
    p.add_argument("--batch-sizes", default="16,32,64")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json")
    args = p.parse_args()
    if not _small_gemm.max_rows:
        print(f"the small-row kernel is not in use here: {_blas.describe()}")
        sys.exit(1)
    default_limit = _small_gemm.max_rows
    model, tokenizer = load(args.model)
    header = f"{machine()}; BLAS: {_blas.describe()}; load average {os.getloadavg()[0]:.2f}"
    print(header)
    print("products (all projections and the LM head):")
    report = {"machine": header, "blas": _blas.describe(),
              "products": products(model, [int(r) for r in args.rows.split(",") if r], args.repeats)}
    if args.batch_sizes:
        print("decode steps:")
        report["steps"] = steps(model, tokenizer,
                                [int(b) for b in args.batch_sizes.split(",")], args.repeats)
    _small_gemm.set_max_rows(default_limit)
    report["load_average_end"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
