#!/usr/bin/env python
"""How long decoding rows wait while prompts join them: ``prefill_tokens_per_step`` swept.

    python scripts/bench_prefill_stall.py --model /tmp/smollm2-f32 [--decoding 8]
        [--decoding-len 128] [--joining 8] [--joining-len 1024]
        [--budgets 0,2048,512,128,64] [--json out.json]

Per budget (0: no bound, whole ``--prefill-step-size`` chunks), in one process, on
``BatchGenerator``: ``--decoding`` prompts of ``--decoding-len`` tokens are prefilled and
decode; two steps later ``--joining`` prompts of ``--joining-len`` tokens are inserted at
once (a burst of requests reaching a busy server). Every ``next()`` until each joining row
has its first token is timed: that is the decoding rows' inter-token latency while the
burst is prefilled. Reported per budget: the longest and the median such step, the
joining rows' time to their first token, the decoding rows' tokens/s over the join, and
whether every row's greedy tokens equal the first budget's (``=first``). All rows decode
greedily with no stop tokens, so every budget does the same work.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before anything imports mlx.core)

from bench import build_prompts, resolve_model_dir  # noqa: E402
from bench_report import kernels, machine  # noqa: E402
from mlx_lm_batched import load  # noqa: E402
from mlx_lm_batched.generate import BatchGenerator  # noqa: E402

JOINING_TOKENS = 4  # tokens each joining row generates (its first token is what is timed)


def measure(model, decoding, joining, budget, prefill_step_size):
    """One burst under ``budget`` (0: none): step times during the join, the joining rows'
    time to first token, the decoding rows' tokens/s over the join, and every row's tokens."""
    rows = len(decoding) + len(joining)
    gen = BatchGenerator(model, max_tokens=1 << 20, completion_batch_size=rows,
                         prefill_batch_size=max(len(decoding), len(joining)),
                         prefill_step_size=prefill_step_size,
                         prefill_tokens_per_step=budget or None, return_logprobs=False,
                         return_caches=False)
    tokens = {uid: [] for uid in gen.insert(decoding)}
    steps_decoded = 0
    while steps_decoded < 3:  # prefilled, then two decode steps before the burst
        _, responses = gen.next()
        steps_decoded += bool(responses)
        for r in responses:
            tokens[r.uid].append(r.token)
    joined = gen.insert(joining, max_tokens=[JOINING_TOKENS] * len(joining))
    tokens.update({uid: [] for uid in joined})
    start, first, steps, decoded = time.perf_counter(), {}, [], 0
    while len(first) < len(joined):
        tic = time.perf_counter()
        _, responses = gen.next()
        steps.append(time.perf_counter() - tic)
        for r in responses:
            tokens[r.uid].append(r.token)
            if r.uid in first or r.uid in joined:
                first.setdefault(r.uid, time.perf_counter() - start)
            else:
                decoded += 1
    join_s = time.perf_counter() - start
    while any(len(tokens[u]) < JOINING_TOKENS for u in joined):
        for r in gen.next()[1]:
            tokens[r.uid].append(r.token)
    gen.close()
    return {"budget": budget, "steps": len(steps), "step_max_ms": 1e3 * max(steps),
            "step_p50_ms": 1e3 * statistics.median(steps), "ttft_s": max(first.values()),
            "join_s": join_s, "decode_tps": decoded / join_s,
            "tokens": [tokens[u] for u in sorted(tokens)]}


def run(args):
    model_dir = resolve_model_dir(args.model)
    model, tokenizer = load(str(model_dir))
    decoding = build_prompts(tokenizer, args.decoding, seed=args.seed,
                             min_len=args.decoding_len, max_len=args.decoding_len)
    joining = build_prompts(tokenizer, args.joining, seed=args.seed + 1,
                            min_len=args.joining_len, max_len=args.joining_len)
    results = []
    for budget in args.budgets:
        r = measure(model, decoding, joining, budget, args.prefill_step_size)
        ref = results[0]["tokens"] if results else r["tokens"]
        # Decoding rows ran for different numbers of steps: compare what both generated.
        r["equal_to_first"] = all(a[:min(len(a), len(b))] == b[:min(len(a), len(b))]
                                  for a, b in zip(r["tokens"], ref))
        results.append(r)
    for r in results:
        del r["tokens"]
    return {"model": str(args.model), "machine": machine(), "kernels": kernels(),
            "decoding": [args.decoding, args.decoding_len],
            "joining": [args.joining, args.joining_len],
            "prefill_step_size": args.prefill_step_size, "results": results}


def print_table(out, file=sys.stdout):
    print(f"model {out['model']} ({out['machine']}; {out['kernels']})", file=file)
    (d, dl), (j, jl) = out["decoding"], out["joining"]
    print(f"{d} rows of {dl}-token prompts decoding; {j} prompts of {jl} tokens join at once; "
          f"prefill_step_size {out['prefill_step_size']}", file=file)
    print(f"{'budget':>7} {'steps':>6} {'step max':>9} {'step p50':>9} {'TTFT':>7} "
          f"{'decode t/s':>10} {'=first':>7}", file=file)
    for r in out["results"]:
        print(f"{r['budget'] or 'none':>7} {r['steps']:6d} {r['step_max_ms']:7.0f}ms "
              f"{r['step_p50_ms']:7.0f}ms {r['ttft_s']:6.2f}s {r['decode_tps']:10.1f} "
              f"{'yes' if r['equal_to_first'] else 'NO':>7}", file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory or .gguf file")
    p.add_argument("--decoding", type=int, default=8, help="rows decoding when the burst comes")
    p.add_argument("--decoding-len", type=int, default=128)
    p.add_argument("--joining", type=int, default=8, help="prompts arriving at once")
    p.add_argument("--joining-len", type=int, default=1024)
    p.add_argument("--budgets", default="0,2048,512,128,64",
                   help="prefill_tokens_per_step values, comma-separated (0: no bound)")
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    try:
        args.budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        p.error(f"--budgets: expected comma-separated integers, got {args.budgets!r}")
    if any(b < 0 for b in args.budgets) or min(args.decoding, args.joining) < 1:
        p.error("--budgets must be >= 0 and --decoding, --joining >= 1")
    out = run(args)
    print_table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
