#!/usr/bin/env python
"""The decode kernels' threads: helpers that join as they wake (``native/shared_work.cpp``,
the default) against OpenMP's parallel for and one thread, in one process.

    python scripts/bench_shared_work.py --model DIR_OR_GGUF [--batch-sizes 1,4,16]
        [--prompt-tokens 256] [--tokens 64] [--repeats 6] [--dequantize] [--json out.json]

For each batch size, ``batch_generate`` runs ``--repeats`` rounds of greedy generation of
``--tokens`` tokens from corpus prompts of ``--prompt-tokens`` tokens, the three ways
alternated within each round so that machine noise hits them alike; prints the median
decode rate (``generation_tps``) of each way, each round's ratio of shared work over
OpenMP, and whether all three gave the same tokens (they must: a chunk is computed the
same whoever computes it). ``--dequantize`` loads a quantized model as float32 (the
small-row float32 matmul, ``native/small_gemm.c``, shares its products the same way).
"""

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench_report, and the working tree's package

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before mlx.core)
from bench_report import kernels, machine  # noqa: E402
from mlx_lm_batched import _cpu_prims, _small_gemm, batch_generate, load  # noqa: E402

WAYS = (("openmp", False, None), ("shared", True, None), ("one thread", True, 1))


def corpus_prompts(tokenizer, count, length):
    with open(os.path.join(os.path.dirname(HERE), "tests", "data", "corpus.txt")) as f:
        ids = tokenizer.encode(f.read())
    if len(ids) < length + 37 * count:
        raise SystemExit(f"the corpus has {len(ids)} tokens: too few for {count} prompts "
                         f"of {length}")
    return [ids[37 * i:37 * i + length] for i in range(count)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--dequantize", action="store_true",
                    help="a quantized model's weights as float32 (load(..., dequantize=True))")
    ap.add_argument("--json")
    args = ap.parse_args()
    module = _cpu_prims.module()
    if module is None:
        raise SystemExit(f"the CPU primitives are not built: {_cpu_prims.problem}")
    threads = _cpu_prims.configured_threads()
    model, tokenizer = load(args.model, dequantize=args.dequantize)
    load_before = os.getloadavg()[0]
    result = {"machine": machine(), "kernels": kernels(), "model": args.model,
              "dequantize": args.dequantize,
              "threads": threads, "prompt_tokens": args.prompt_tokens,
              "tokens": args.tokens, "repeats": args.repeats, "results": []}
    print(f"{result['machine']}; {result['kernels']}; load average {load_before:.2f}")
    print(f"{'batch':>5} {'way':>10} {'tok/s median':>12}  rounds")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        prompts = corpus_prompts(tokenizer, batch, args.prompt_tokens)
        rates = {name: [] for name, _, _ in WAYS}
        texts = {}
        batch_generate(model, tokenizer, prompts, max_tokens=4, verbose=False)  # warm-up
        for _ in range(args.repeats):
            for name, shared, count in WAYS:
                module.set_shared_work(shared)
                module.set_threads(count or threads)
                _small_gemm.set_threads(count or threads)
                response = batch_generate(model, tokenizer, prompts, max_tokens=args.tokens,
                                          verbose=False)
                rates[name].append(response.stats.generation_tps)
                texts.setdefault(name, response.texts)
        module.set_shared_work(True)
        module.set_threads(threads)
        _small_gemm.set_threads(threads)
        same = all(t == texts["openmp"] for t in texts.values())
        ratios = [s / o for s, o in zip(rates["shared"], rates["openmp"])]
        for name, values in rates.items():
            print(f"{batch:5d} {name:>10} {statistics.median(values):12.1f}  "
                  + " ".join(f"{v:.1f}" for v in values))
        print(f"{batch:5d} {'shared/openmp':>10} {statistics.median(ratios):12.2f}  "
              + " ".join(f"{r:.2f}" for r in ratios) + f"   same tokens: {same}")
        result["results"].append({"batch": batch, "tok_per_s": rates, "same_tokens": same,
                                  "shared_over_openmp": ratios})
    result["load_average"] = [load_before, os.getloadavg()[0]]
    print(f"load average at end {result['load_average'][1]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not all(r["same_tokens"] for r in result["results"]):
        raise SystemExit("the three ways gave different tokens")


if __name__ == "__main__":
    main()
