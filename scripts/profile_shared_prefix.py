#!/usr/bin/env python
"""Rows continued from one stored prefix, straight through ``BatchGenerator``: per-step
time, when rows start, and decode steps, with the prefix read from the shared blocks
against dense copies of it.

    python scripts/profile_shared_prefix.py MODEL_DIR

16 rows, each a 1,800-token prefix of corpus text (stored once in a block store) and 50
tokens of its own, 16 greedy tokens each; run shared, dense, shared again. Prints the
total time, TTFT p50 / max, the first steps as (seconds, prompt responses, tokens), and
the mean decode-only step.
"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import mlx_lm_batched  # noqa
import mlx.core as mx
from mlx_lm_batched import load
from mlx_lm_batched.cache.kv import KVCache
from mlx_lm_batched.sched.block_prefix import make_prefix_cache
from mlx_lm_batched.sched.generator import BatchGenerator

M = sys.argv[1]
model, tok = load(M)
ids = tok.encode(open(ROOT / 'tests' / 'data' / 'corpus.txt').read(), add_special_tokens=False) * 3
system = ids[:1800]
prefix = make_prefix_cache(model, block_size=32)
gen = BatchGenerator(model)
gen.insert([system + ids[2000:2010]], max_tokens=[1])
fin = None
while fin is None:
    for r in gen.next()[1]:
        if r.finish_reason: fin = r
gen.close()
prefix.insert_cache(model, fin.all_tokens, fin.prompt_cache)
prompts = [system + ids[3000 + 60 * i: 3050 + 60 * i] for i in range(16)]

def run(dense):
    fetched = [prefix.fetch_nearest_cache(model, p) for p in prompts]
    caches = []
    for c, _ in fetched:
        if dense:
            d = []
            for layer in c:
                k, v = layer.state
                x = KVCache(); x.state = [mx.array(k), mx.array(v)]; d.append(x)
            c = d
        caches.append(c)
    g = BatchGenerator(model)
    t0 = time.perf_counter()
    uids = g.insert([rest for _, rest in fetched], max_tokens=[16] * 16, caches=caches,
                    all_tokens=[p[:len(p) - len(rest)] for p, (_, rest) in zip(prompts, fetched)])
    first, steps, done = {}, [], 0
    while done < 16:
        tic = time.perf_counter()
        pr, gr = g.next()
        steps.append((round(time.perf_counter() - tic, 3), len(pr), len(gr)))
        for r in gr:
            first.setdefault(r.uid, time.perf_counter() - t0)
            done += r.finish_reason is not None
    g.close()
    tt = sorted(first.values())
    print("dense" if dense else "shared", "total %.2f s" % (time.perf_counter() - t0),
          "ttft p50 %.2f max %.2f" % (tt[8], tt[-1]))
    print("  steps (s, prompt responses, tokens):", steps[:24])
    dec = [s for s, p, g in steps if p == 0 and g]
    print("  decode-only steps: %d, mean %.3f s" % (len(dec), sum(dec) / max(1, len(dec))))

run(False)
run(True)
run(False)
