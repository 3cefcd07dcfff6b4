#!/usr/bin/env python
"""What a prefill's peak memory consists of: MLX's peak above the weights, the process's
peak RSS, and the KV bytes the prompt produced, for R rows x L tokens through
``BatchGenerator``.

    python scripts/profile_prefill_memory.py --model DIR [--shapes 1x1500,5x1500]
        [--prefill-step-size 2048] [--json out.json]

Each shape runs in a process of its own (so its ``VmHWM`` is its own): the model is
loaded, one warm-up prefill of the same shape runs (the allocator's cache and the compiled
kernels then exist, as in a warm server), MLX's cache is cleared and its peak reset, and
the timed prefill inserts R distinct corpus prompts of exactly L tokens into a fresh
``BatchGenerator`` and steps until every row has its first token. Reported:
``mlx_peak_gb`` (``mx.get_peak_memory()`` minus the active memory before, i.e. the weights),
``kv_gb`` (the bytes of the rows' caches after prefill), ``transient_gb`` (the peak minus
the KV: what the prefill's temporaries add), ``rss_first_gb`` (the first prefill's
``VmHWM`` above the loaded model's ``VmRSS``: kernels compiled, heap grown),
``rss_peak_gb`` (``VmHWM`` minus ``VmRSS``
before the timed prefill; the warm-up already raised ``VmHWM``, so the high-water mark is
reset through ``/proc/self/clear_refs`` where allowed, else this reads ``null``), and the
prefill tokens/s. The header names the load average.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]  # the working tree

GB = 1e9


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        rows, length = item.lower().split("x")
        shapes.append((int(rows), int(length)))
    return shapes


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def reset_hwm():
    """Reset ``VmHWM`` to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def corpus_prompts(tokenizer, rows, length, stride=997):
    """``rows`` distinct prompts of exactly ``length`` token ids cut from the test corpus."""
    text = (HERE.parent / "tests" / "data" / "corpus.txt").read_text(encoding="utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < length + rows * stride:
        ids = ids + ids
    return [ids[i * stride:i * stride + length] for i in range(rows)]


def cache_bytes(caches):
    import mlx.core as mx
    total = 0
    for c in caches:
        state = c.state if hasattr(c, "state") else c
        arrays = [a for a in _flatten(state) if isinstance(a, mx.array)]
        total += sum(a.nbytes for a in arrays)
    return total


def _flatten(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flatten(y)
    else:
        yield x


def prefill(model, prompts, step):
    """Prefill ``prompts`` through a fresh ``BatchGenerator``; returns it once every row
    has its first token (``(generator, responses)``)."""
    from mlx_lm_batched.generate import BatchGenerator
    gen = BatchGenerator(model, prefill_step_size=step, prefill_batch_size=len(prompts),
                         completion_batch_size=len(prompts), max_tokens=2)
    uids = gen.insert(prompts)
    first = {}
    while len(first) < len(uids):
        _, responses = gen.next()
        for r in responses:
            first.setdefault(r.uid, r.token)
    return gen, [first[u] for u in uids]


def one_case(model_dir, rows, length, step):
    import mlx_lm_batched  # noqa: F401  (BLAS preload before mlx.core)
    import mlx.core as mx
    from mlx_lm_batched import load
    model, tokenizer = load(model_dir)
    prompts = corpus_prompts(tokenizer, rows, length)
    loaded = status_kb("VmRSS")
    reset_hwm()
    gen, _ = prefill(model, prompts, step)  # warm-up: kernels, allocator cache
    del gen
    first_hwm = status_kb("VmHWM")
    mx.synchronize()
    mx.clear_cache()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    rss0 = status_kb("VmRSS")
    hwm_ok = reset_hwm()
    tic = time.perf_counter()
    gen, tokens = prefill(model, prompts, step)
    mx.synchronize()
    seconds = time.perf_counter() - tic
    peak = mx.get_peak_memory() - base
    kv = sum(cache_bytes(b.engine.cache) for b in [gen._decode] if b is not None)
    hwm = status_kb("VmHWM")
    return {
        "rows": rows, "tokens": length, "prefill_step_size": step,
        "mlx_peak_gb": round(peak / GB, 4), "kv_gb": round(kv / GB, 4),
        "transient_gb": round((peak - kv) / GB, 4),
        "rss_first_gb": round((first_hwm - loaded) * 1024 / GB, 4),
        "rss_peak_gb": round((hwm - rss0) * 1024 / GB, 4) if hwm_ok else None,
        "prefill_tokens_per_s": round(rows * length / seconds, 1),
        "first_tokens": tokens,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--shapes", default="1x1500,5x1500")
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--json")
    p.add_argument("--case", help=argparse.SUPPRESS)  # one shape, in this process
    args = p.parse_args(argv)
    if args.case:
        (rows, length), = parse_shapes(args.case)
        print(json.dumps(one_case(args.model, rows, length, args.prefill_step_size)))
        return
    print(f"# load average {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    for rows, length in parse_shapes(args.shapes):
        out = subprocess.run(
            [sys.executable, __file__, "--model", args.model, "--case", f"{rows}x{length}",
             "--prefill-step-size", str(args.prefill_step_size)],
            check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "first_tokens"}), flush=True)
    print(f"# load average {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
