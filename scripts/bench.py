#!/usr/bin/env python
"""Side-by-side generation benchmark: sequential vs batched vs mlx-lm.

    python scripts/bench.py --model /tmp/smollm2-f32 [--prompts 32] [--max-tokens 64]
        [--batch-sizes 1,2,4,8,16,32,64] [--repeats 2] [--json out.json] [--plot out.png]
        [--no-mlx-lm] [--dequantize] [--compare-blas] [--max-prompt-len 512]

One run measures, interleaved round-robin over repeats (so machine noise hits every
configuration alike):

- ``seq``: this package's ``stream_generate``, one prompt at a time;
- ``ours``: this package's ``batch_generate`` at each ``completion_batch_size``;
- ``mlx-lm``: mlx-lm's batch generator (what its ``batch_generate`` runs) on the
  same token prompts, when ``mlx_lm`` is importable;
- with ``--dequantize`` (for a quantized model): also ``ours+dq``, our
  ``batch_generate`` on the model loaded with ``load(..., dequantize=True)``.

Every row generates exactly ``--max-tokens`` tokens greedily: EOS is ignored on all
sides (our tokenizer copy has no EOS ids; mlx-lm's generator gets no stop tokens),
so all configurations do the same work. Prompts are cut from ``tests/data/corpus.txt``
at seeded places with log-uniform lengths in [16, 512] (many short, a few long).

``--hybrid qwen3_next`` benches a random Qwen3-Next checkpoint (hidden 512, 8 layers,
built once by ``bench_hybrid.py`` with transformers) that has ``--model``'s tokenizer and
vocabulary, in place of ``--model`` itself. ``same_tokens_as_own_bs1`` in the JSON (the
table's footer) says how many rows of each batched run equal that side's batch-1 rows.

``--compare-blas`` runs the whole bench once per CPU BLAS found on the machine (MKL,
OpenBLAS, MLX's bundled reference BLAS), each as a subprocess with
``MLX_LM_BATCHED_BLAS`` set: the BLAS is process-wide, so in each run both our
package and mlx-lm use the same one. The header names the CPU and the BLAS.
"""

import argparse
import copy
import json
import os
import random
import sys
import time
from pathlib import Path

# Run against the working tree this script lives in, not an installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before anything imports mlx.core)
import mlx.core as mx  # noqa: E402

from mlx_lm_batched import load, stream_generate, _blas  # noqa: E402

from bench_blas import compare_blas  # noqa: E402
from bench_report import attention, machine, plot, print_table  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "corpus.txt"


def build_prompts(tokenizer, n, seed=0, min_len=16, max_len=512):
    """``n`` distinct token prompts cut from the corpus (wrapping around), seeded."""
    ids = tokenizer.encode(CORPUS.read_text(encoding="utf-8"), add_special_tokens=False)
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        length = int(round(min_len * (max_len / min_len) ** rng.random()))
        start = rng.randrange(len(ids))
        prompts.append([ids[(start + j) % len(ids)] for j in range(length)])
    return prompts


def no_eos(tokenizer):
    """A copy of our tokenizer wrapper that never stops on EOS (fixed-length rows)."""
    t = copy.copy(tokenizer)
    t.eos_token_ids = set()
    return t


def padding_share(lengths, groups):
    """Share of prefill token-columns that are padding when ``groups`` (lists of
    prompt lengths) are each padded to their longest prompt."""
    real = sum(lengths)
    total = sum(max(g) * len(g) for g in groups)
    return 1 - real / total if total else 0.0


def our_prefill_groups(lengths, bs, split=True):
    """The groups our engine prefills: length-sorted batches of ``bs``, each split by
    ``plan_prefill_groups`` over the tokens before the last (fed to all rows at once).
    ``split=False``: each batch in one group (ring caches the prompts wrap: the engine
    splits only batches whose caches all have row views)."""
    from mlx_lm_batched.engine.prefill_plan import plan_prefill_groups

    ordered, groups = sorted(lengths), []
    for i in range(0, len(ordered), bs):
        batch = ordered[i:i + bs]
        spans = plan_prefill_groups([n - 1 for n in batch]) if split else [(0, len(batch))]
        for a, b in spans:
            groups.append([n - 1 for n in batch[a:b]])
        groups.append([1] * len(batch))  # the last column
    return [g for g in groups if max(g) > 0]


class Timeline:
    """Per-row first-token times of one configuration, from the run's start."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first = {}

    def token(self, row):
        if row not in self.first:
            self.first[row] = time.perf_counter() - self.start

    @property
    def ttft_mean(self):
        return sum(self.first.values()) / max(len(self.first), 1)


def run_sequential(model, tokenizer, prompts, max_tokens):
    t = Timeline()
    prompt_time, out = 0.0, []
    for i, p in enumerate(prompts):
        tic = time.perf_counter()
        toks = []
        for r in stream_generate(model, tokenizer, p, max_tokens=max_tokens):
            if not toks:
                prompt_time += time.perf_counter() - tic
                t.token(i)
            toks.append(r.token)
        out.append(toks)
    return out, t, prompt_time, sum(len(p) for p in prompts)


def run_ours(model, tokenizer, prompts, max_tokens, bs):
    from mlx_lm_batched.generate import BatchStats

    t, stats = Timeline(), BatchStats()
    out = [[] for _ in prompts]
    from mlx_lm_batched import stream_batch_generate

    for r in stream_batch_generate(model, tokenizer, prompts, max_tokens,
                                   completion_batch_size=bs, stats=stats):
        t.token(r.index)
        out[r.index].append(r.token)
    return out, t, stats.prompt_time, stats.prompt_tokens


def run_mlx_lm(model, prompts, max_tokens, bs):
    """mlx-lm's ``batch_generate`` loop, timed per token (same generator, no EOS stop)."""
    from mlx_lm.generate import BatchGenerator

    t = Timeline()
    # prefill_batch_size defaults to 8 and also raises the completion batch to 8;
    # capping it at bs keeps the requested concurrency (defaults otherwise).
    gen = BatchGenerator(model, stop_tokens=None, completion_batch_size=bs,
                         prefill_batch_size=min(8, bs))
    uids = gen.insert(prompts, [max_tokens] * len(prompts))
    row = {u: i for i, u in enumerate(uids)}
    out = [[] for _ in prompts]
    with gen.stats() as stats:
        while responses := gen.next_generated():
            for r in responses:
                t.token(row[r.uid])
                out[row[r.uid]].append(r.token)
    gen.close()
    return out, t, stats.prompt_time, stats.prompt_tokens


def measure(fn, weights_bytes):
    """Run ``fn`` once; returns its outputs and wall time, peak memory and timeline."""
    mx.synchronize()
    mx.clear_cache()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    tic = time.perf_counter()
    out, timeline, prompt_time, prompt_tokens = fn()
    wall = time.perf_counter() - tic
    # Peak above what was resident before (both models' weights), plus our own weights.
    peak = weights_bytes + mx.get_peak_memory() - base
    generated = sum(len(o) for o in out)
    return out, {
        "wall_s": wall,
        "prompt_tokens": prompt_tokens,
        "prompt_s": prompt_time,
        "prompt_tps": prompt_tokens / prompt_time if prompt_time else 0.0,
        "generated": generated,
        # As both libraries define it: tokens over the time not spent on prompts.
        "gen_tps": generated / max(wall - prompt_time, 1e-9),
        "e2e_tps": generated / wall,
        "ttft_first_s": min(timeline.first.values()),
        "ttft_mean_s": timeline.ttft_mean,
        "peak_gb": peak / 1e9,
    }


def ideal_cache_bytes(model, lengths):
    """Key/value cache and recurrent state of every row alone: its prompt plus its
    generated tokens, no padding (state: one row's worth per prompt)."""
    from mlx_lm_batched.engine.kv_budget import cache_bytes
    from mlx_lm_batched.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    return sum(sum(cache_bytes(model, cache, 1, n)) for n in lengths)


def plain_caches(model, slots):
    """True when the engine prefills the model's batches of up to ``slots`` columns
    group by group (every cache has a row view: no ring the prompts would wrap)."""
    from mlx_lm_batched.models.cache import make_prompt_cache
    from mlx_lm_batched.cache.views import has_rows_view

    return all(has_rows_view(c, slots) for c in make_prompt_cache(model))


def tree_bytes(model):
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def load_mlx_lm(path):
    try:
        import mlx_lm
    except ImportError:
        return None
    model, _ = mlx_lm.load(str(path))  # as mlx-lm loads it (quantized stays quantized)
    return model


def resolve_model_dir(model):
    """A directory both libraries can load: GGUF files are converted once (to /tmp)."""
    if not str(model).endswith(".gguf"):
        return model
    out = Path("/tmp") / ("bench-" + Path(model).stem)
    if not (out / "config.json").exists():
        mlx_lm_batched.convert(model, str(out), dtype="float32")
    return str(out)


def run_bench(args):
    load_start = os.getloadavg()
    path = resolve_model_dir(args.model)
    if args.hybrid:  # a random hybrid checkpoint with --model's tokenizer
        from bench_hybrid import build_checkpoint

        path = str(build_checkpoint(args.hybrid, path))
    model, tokenizer = load(path)
    tokenizer = no_eos(tokenizer)
    dq = load(path, dequantize=True)[0] if args.dequantize else None
    ref = None if args.no_mlx_lm else load_mlx_lm(path)
    prompts = build_prompts(tokenizer, args.prompts, args.seed, args.min_prompt_len,
                            args.max_prompt_len)
    lengths = [len(p) for p in prompts]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if any(b > len(prompts) for b in sizes):
        print(f"note: batch sizes over {len(prompts)} prompts would repeat the largest one; "
              "skipped (raise --prompts)", file=sys.stderr)
        sizes = [b for b in sizes if b <= len(prompts)] or [len(prompts)]
    weights = {"ours": tree_bytes(model)}
    weights["ours+dq"] = tree_bytes(dq) if dq is not None else 0
    weights["seq"] = weights["ours"]
    weights["mlx-lm"] = tree_bytes(ref) if ref is not None else 0
    ideal_kv = ideal_cache_bytes(dq or model, [n + args.max_tokens for n in lengths])
    configs = [("seq", 1, lambda: run_sequential(model, tokenizer, prompts, args.max_tokens))]
    for bs in sizes:
        configs.append(("ours", bs, lambda bs=bs: run_ours(model, tokenizer, prompts,
                                                              args.max_tokens, bs)))
        if dq is not None:
            configs.append(("ours+dq", bs, lambda bs=bs: run_ours(dq, tokenizer, prompts,
                                                                   args.max_tokens, bs)))
        if ref is not None:
            configs.append(("mlx-lm", bs, lambda bs=bs: run_mlx_lm(ref, prompts,
                                                                    args.max_tokens, bs)))
    # Warm up both libraries (first-call allocations and kernel setup).
    run_ours(model, tokenizer, prompts[:2], 2, 2)
    if ref is not None:
        run_mlx_lm(ref, prompts[:2], 2, 2)
    runs = {f"{name}@{bs}": [] for name, bs, _ in configs}
    tokens = {}
    for rep in range(args.repeats):
        # Rotate the starting point so no configuration always runs first.
        order = configs[rep % len(configs):] + configs[: rep % len(configs)]
        for name, bs, fn in order:
            out, m = measure(fn, weights[name])
            runs[f"{name}@{bs}"].append(m)
            tokens[f"{name}@{bs}"] = out
            print(f"  rep {rep + 1} {name:7s} bs={bs:<3d} gen {m['gen_tps']:7.1f} tok/s  "
                  f"wall {m['wall_s']:6.1f}s", file=sys.stderr, flush=True)
    best = {k: max(v, key=lambda m: m["gen_tps"]) for k, v in runs.items()}
    seq_tokens = tokens["seq@1"]
    rows = []
    for name, bs, _ in configs:
        key = f"{name}@{bs}"
        m = dict(best[key], config=name, batch_size=bs)
        if name.startswith("ours"):
            groups = our_prefill_groups(lengths, bs, split=plain_caches(model, max(lengths)))
        elif name == "mlx-lm":  # prompts in arrival order, prefilled 8 at a time
            step = min(8, bs)
            groups = [lengths[i:i + step] for i in range(0, len(lengths), step)]
        else:
            groups = [[n] for n in lengths]
        m["padding_share"] = padding_share(lengths, groups)
        m["same_tokens_as_seq"] = same_share(tokens[key], seq_tokens)
        # Exactness of each side against its own batch-1 rows (mlx-lm's solo rows may
        # differ from ours by float rounding; its batched rows should not from its own).
        solo = tokens.get(f"{name}@1")
        if solo is not None and name != "seq":
            m["same_tokens_as_own_bs1"] = same_share(tokens[key], solo)
        m["peak_vs_weights_plus_ideal_kv"] = m["peak_gb"] * 1e9 / (weights[name] + ideal_kv)
        rows.append(m)
    seq = best["seq@1"]
    for m in rows:
        m["gen_vs_seq"] = m["gen_tps"] / seq["gen_tps"]
        m["e2e_vs_seq"] = m["e2e_tps"] / seq["e2e_tps"]
        other = best.get(f"mlx-lm@{m['batch_size']}")
        if m["config"].startswith("ours") and other:
            m["gen_vs_mlx_lm"] = m["gen_tps"] / other["gen_tps"]
            m["e2e_vs_mlx_lm"] = m["e2e_tps"] / other["e2e_tps"]
    return {
        "model": path if args.hybrid else str(args.model), "dequantize": args.dequantize,
        "hybrid": args.hybrid, "load_avg_start": load_start, "load_avg_end": os.getloadavg(), "prompts": args.prompts,
        "prompt_lengths": lengths, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "blas": _blas.describe(), "attention": attention(), "blas_kind": _blas.loaded_kind, "weights_gb": weights["ours"] / 1e9,
        "ideal_kv_gb": ideal_kv / 1e9,
        "machine": machine(), "rows": rows, "all_runs": runs,
    }


def same_share(rows, reference):
    """Share of rows whose tokens equal the reference row's."""
    return sum(a == b for a, b in zip(rows, reference)) / len(reference)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory, .gguf file or repo id")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--no-mlx-lm", action="store_true")
    p.add_argument("--dequantize", action="store_true",
                   help="also run ours on the model loaded with dequantize=True")
    p.add_argument("--min-prompt-len", type=int, default=16)
    p.add_argument("--max-prompt-len", type=int, default=512)
    p.add_argument("--compare-blas", action="store_true")
    p.add_argument("--hybrid", default=None, metavar="MODEL_TYPE",
                   help="bench a random hybrid checkpoint of this family (qwen3_next: hidden "
                        "512, 8 layers) with --model's tokenizer and vocabulary; needs torch "
                        "and transformers to build it once")
    args = p.parse_args(argv)
    if args.compare_blas:
        results = compare_blas(os.path.abspath(__file__), argv)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    else:
        result = run_bench(args)
        print_table(result)
        results = {"": result}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
