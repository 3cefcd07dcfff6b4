"""A/B of ``stream_batch_generate`` between this tree and an earlier commit, in one process.

The earlier commit's package is extracted with ``git archive`` into a temporary directory
under another name (``mlx_lm_batched_baseline``; the package imports itself relatively), so
both load the same weights in one process and run interleaved: the machine's noise (a
shared 2-core box) hits both sides alike. Written for the move of ``batch_generate``
from its own static loop onto ``BatchGenerator`` (one batch loop); the default baseline
is the last commit with the static loop.

    python scripts/bench_batch_loop.py --model DIR [--baseline e93fe85] [--prompts 32]
        [--max-tokens 16] [--batch-sizes 4,16,32] [--repeats 2] [--json out.json]
        [--count-calls]

Prints end-to-end tokens/s of both sides per batch size (best of ``--repeats``), their
ratio and whether both produced the same tokens (greedy, no EOS); also the ratio of the
process CPU seconds each side spent. On a loaded machine the CPU-time ratio is the one to
read: wall time then measures the other tenants. Run it with ``OPENBLAS_NUM_THREADS=1``
(or ``MKL_NUM_THREADS=1``) there: a BLAS thread pool oversubscribed by other processes
spin-waits, which burns CPU time on both sides and slows a run by 10x or more.
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# The package before mlx.core: importing it loads the fast CPU BLAS, which MLX only
# picks up when it is loaded first (else both sides run on the bundled reference BLAS).
import mlx_lm_batched  # noqa: E402, I001

import mlx.core as mx  # noqa: E402
from bench import build_prompts, no_eos  # noqa: E402


def extract_baseline(commit, directory):
    """The package at ``commit`` as ``directory/mlx_lm_batched_baseline``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "mlx_lm_batched"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    os.rename(Path(directory, "mlx_lm_batched"), Path(directory, "mlx_lm_batched_baseline"))
    sys.path.insert(0, str(directory))
    return importlib.import_module("mlx_lm_batched_baseline")


class CallCounter:
    """Counts a model's forward calls and input tokens (rows x columns): the work each side
    does, which no other tenant of the machine can change."""

    def __init__(self, model):
        self.calls = self.tokens = self.decode_calls = 0
        cls, forward = type(model), type(model).__call__
        counter = self

        def counted(self, inputs, *args, **kwargs):
            counter.calls += 1
            counter.tokens += inputs.shape[0] * inputs.shape[1]
            counter.decode_calls += inputs.shape[1] == 1
            return forward(self, inputs, *args, **kwargs)

        # A subclass per side, so the two packages' classes are counted apart.
        model.__class__ = type(cls.__name__, (cls,), {"__call__": counted})

    def take(self):
        """``(calls, tokens, decode calls)`` since the last take."""
        taken = (self.calls, self.tokens, self.decode_calls)
        self.calls = self.tokens = self.decode_calls = 0
        return taken


def run(package, model, tokenizer, prompts, max_tokens, batch_size):
    """Tokens per prompt and wall seconds of one ``stream_batch_generate`` call."""
    out = [[] for _ in prompts]
    tic, cpu = time.perf_counter(), time.process_time()
    for r in package.stream_batch_generate(model, tokenizer, prompts, max_tokens,
                                           completion_batch_size=batch_size, logprobs=False):
        out[r.index].append(r.token)
    return out, time.perf_counter() - tic, time.process_time() - cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--baseline", default="e93fe85", help="commit with the old batch loop")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--batch-sizes", default="4,16,32")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--count-calls", action="store_true",
                   help="also count each side's model calls and input tokens")
    args = p.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        old = extract_baseline(args.baseline, tmp)
        sides = {"baseline": old, "this tree": mlx_lm_batched}
        loaded = {name: pkg.load(args.model) for name, pkg in sides.items()}
        prompts = build_prompts(loaded["this tree"][1], args.prompts)
        counters = ({name: CallCounter(model) for name, (model, _) in loaded.items()}
                    if args.count_calls else {})
        for name, pkg in sides.items():  # warm up both
            run(pkg, loaded[name][0], no_eos(loaded[name][1]), prompts[:4], 2, 2)
        for counter in counters.values():
            counter.take()  # the warm-up's calls
        load0 = os.getloadavg()
        best, best_cpu, tokens = {}, {}, {}
        for rep in range(args.repeats):
            for bs in sizes:
                order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
                for name in order:
                    mx.synchronize()
                    mx.clear_cache()
                    model, tok = loaded[name]
                    out, wall, cpu = run(sides[name], model, no_eos(tok), prompts,
                                         args.max_tokens, bs)
                    tokens[name, bs] = out
                    best[name, bs] = min(best.get((name, bs), float("inf")), wall)
                    best_cpu[name, bs] = min(best_cpu.get((name, bs), float("inf")), cpu)
                    work = ""
                    if counters:
                        calls, toks, decode = counters[name].take()
                        work = f"  {calls} calls ({decode} decode), {toks} input tokens"
                    print(f"rep {rep} {name:9s} bs={bs:<3d} {wall:7.1f} s wall "
                          f"{cpu:7.1f} s CPU{work}", flush=True)
    n = args.prompts * args.max_tokens
    lengths = [len(x) for x in prompts]
    print(f"\n{args.prompts} prompts ({min(lengths)}-{max(lengths)} tokens), {args.max_tokens} "
          f"new tokens, best of {args.repeats}; BLAS {mlx_lm_batched._blas.describe()}; "
          f"load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print("batch  baseline tok/s  this tree tok/s  this/baseline  CPU this/baseline  same tokens")
    rows = []
    for bs in sizes:
        a, b = best["baseline", bs], best["this tree", bs]
        ca, cb = best_cpu["baseline", bs], best_cpu["this tree", bs]
        same = tokens["baseline", bs] == tokens["this tree", bs]
        print(f"{bs:<6d} {n / a:14.1f} {n / b:16.1f} {a / b:14.2f} {ca / cb:18.2f}  {same}")
        rows.append({"batch_size": bs, "baseline_s": a, "this_tree_s": b, "ratio": a / b,
                     "baseline_cpu_s": ca, "this_tree_cpu_s": cb, "cpu_ratio": ca / cb,
                     "same_tokens": same})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
