"""One quantized linear layer on the CPU: our primitive against MLX's op and the float32 layer.

    python scripts/bench_quantized_linear.py [--shapes 1536x576,576x1536,49152x576]
        [--rows 1,8,16,32,64,128] [--bits 4] [--group 64] [--scales float32]
        [--threads N] [--copies N] [--json out.json]

For each weight shape (N x K: N outputs, K inputs; SmolLM2-135M's MLP and tied LM head by
default) and each number of input rows: the best time of ``--repeats`` rounds of ``--calls``
evaluated calls of ``_cpu_prims.quantized_linear`` (MLX affine quantization, ``--scales``
float32 as ``convert -q`` writes them or float16 as a GGUF file loads; on ``--threads``
threads, by default the kernels' own count), ``mx.quantized_matmul`` on the same packed
weight, and ``x @ W.T`` on the dequantized float32 weight (MLX's matmul, which goes to the
BLAS or our small-row kernel). Up to 64 rows the primitive runs its decode kernel, above
that it dequantizes into the BLAS.
The JSON also records each case's largest difference from the float32 layer, relative to its
largest output (float32 rounding: about 1e-6).

``--copies N`` keeps N copies of each quantized weight in distinct buffers and cycles through
them, one per call: with N times the weight's bytes above the last-level cache, every call
reads its weight from memory, as a decode step does (85 MB of SmolLM2's Q4_1 weights against
a 32 MB L3 here), where one copy is timed from the cache. ``GB/s`` is the quantized weight's
bytes (values, scales, biases) over our time.
"""

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import mlx_lm_batched  # noqa: E402,F401  (the BLAS and the kernels load before mlx.core)
import mlx.core as mx  # noqa: E402
from mlx_lm_batched import _blas, _cpu_prims  # noqa: E402


def best_ms(fn, calls, repeats):
    for _ in range(2):
        mx.eval(fn())
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        for _ in range(calls):
            mx.eval(fn())
        best = min(best, (time.perf_counter() - tic) / calls)
    return best * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1536x576,576x1536,49152x576")
    p.add_argument("--rows", default="1,8,16,32,64,128")
    p.add_argument("--bits", type=int, default=4, choices=_cpu_prims.QUANTIZED_BITS)
    p.add_argument("--group", type=int, default=64, choices=(32, 64, 128))
    p.add_argument("--scales", default="float32", choices=("float32", "float16"),
                   help="the scales' and biases' dtype (a GGUF file loads as float16)")
    p.add_argument("--threads", type=int, default=None,
                   help="the kernels' threads (default: the package's choice)")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-mlx-op", action="store_true",
                   help="leave out mx.quantized_matmul (slow: about 2 GFLOP/s)")
    p.add_argument("--copies", type=int, default=1,
                   help="copies of each quantized weight cycled through, one a call (enough "
                        "to exceed the CPU's cache: the weights then come from memory)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    kernel = _cpu_prims.module()
    if kernel is None:
        sys.exit(f"error: the CPU primitives are not available: {_cpu_prims.problem}")
    from bench_report import machine

    if args.threads:
        kernel.set_threads(args.threads)

    print(f"{machine()}; BLAS: {_blas.describe()}; load average {os.getloadavg()[0]:.2f}")
    print(f"{args.bits}-bit, group {args.group}, {args.scales} scales, "
          f"{args.threads or 'default'} threads, {args.copies} weight copies; "
          f"best of {args.repeats} x {args.calls} calls")
    print(f"{'N x K':>12} {'rows':>5} {'ours ms':>8} {'GB/s':>6} {'f32 ms':>8} {'mlx op ms':>9} "
          f"{'f32/ours':>8} {'op/ours':>8}")
    results = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = mx.random.normal((n, k), key=mx.random.key(0))
        wq, scales, biases = mx.quantize(w, group_size=args.group, bits=args.bits)
        scales, biases = (a.astype(getattr(mx, args.scales)) for a in (scales, biases))
        dense = mx.dequantize(wq, scales, biases, group_size=args.group, bits=args.bits)
        # Distinct buffers of the same values (an addition makes a new array).
        copies = [(wq, scales, biases)] + [tuple(a + 0 for a in (wq, scales, biases))
                                           for _ in range(args.copies - 1)]
        mx.eval(copies, dense)
        weight_bytes = sum(a.nbytes for a in (wq, scales, biases))
        for rows in (int(r) for r in args.rows.split(",")):
            x = mx.random.normal((rows, k), key=mx.random.key(1))
            mx.eval(x)
            turn = itertools.cycle(copies)
            ours = best_ms(lambda: kernel.quantized_linear(x, *next(turn), None,
                                                           args.group, args.bits),
                           args.calls, args.repeats)
            f32 = best_ms(lambda: x @ dense.T, args.calls, args.repeats)
            op = None if args.skip_mlx_op else best_ms(
                lambda: mx.quantized_matmul(x, wq, scales, biases, transpose=True,
                                            group_size=args.group, bits=args.bits),
                max(1, args.calls // 5), max(1, args.repeats // 2))
            # Same products: ours against the float32 layer on the dequantized weight.
            want = x @ dense.T
            got = kernel.quantized_linear(x, wq, scales, biases, None, args.group, args.bits)
            difference = (mx.abs(got - want).max() / mx.abs(want).max()).item()
            rate = weight_bytes / ours / 1e6
            results.append({"n": n, "k": k, "rows": rows, "ours_ms": ours,
                            "ours_weight_gb_per_s": rate, "f32_ms": f32,
                            "mlx_op_ms": op, "max_relative_difference": difference})
            op_text = f"{op:9.3f}" if op is not None else f"{'-':>9}"
            ratio = f"{op / ours:8.2f}" if op is not None else f"{'-':>8}"
            print(f"{shape:>12} {rows:5d} {ours:8.3f} {rate:6.1f} {f32:8.3f} {op_text} "
                  f"{f32 / ours:8.2f} {ratio}", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine(), "blas": _blas.describe(), "bits": args.bits,
            "group": args.group, "scales": args.scales, "threads": args.threads,
            "copies": args.copies, "calls": args.calls, "repeats": args.repeats,
            "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
