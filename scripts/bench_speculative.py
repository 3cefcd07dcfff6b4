#!/usr/bin/env python
"""Speculative decoding against plain decoding, greedy, at several batch sizes.

    python scripts/bench_speculative.py --model DIR [--draft-model DIR | --draft-layers 8]
        [--batch 1 4 16] [--max-tokens 48] [--num-draft-tokens 3] [--json out.json]

For each batch size the same seeded prompts (cut from tests/data/corpus.txt) run through
this package's ``BatchGenerator`` three ways: ``plain``; ``draft`` (``--draft-model``, or
by default a copy of the model cut to its first ``--draft-layers`` layers: a cheap draft
with the same tokenizer); ``lookup`` (prompt lookup, no draft model). Every row generates
exactly ``--max-tokens`` tokens (no EOS stop). Reported: end-to-end seconds and
tokens/s (prefill included), tokens per row per decode step (1.0 for plain decoding;
accepted drafts + 1 for speculative), the speed-up over plain, and whether every row's
tokens equal plain decoding's (they must: greedy).
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before anything imports mlx.core)
import mlx.core as mx  # noqa: E402

from bench import build_prompts, resolve_model_dir  # noqa: E402
from bench_report import machine  # noqa: E402
from mlx_lm_batched import load  # noqa: E402
from mlx_lm_batched.generate import BatchGenerator  # noqa: E402


def truncated_copy(src, dst, layers):
    """A copy of the checkpoint directory ``src`` in ``dst`` keeping its first ``layers``
    decoder layers: a cheap draft model with the same tokenizer."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (dst / "config.json").write_text(json.dumps(config))
    weights = {}
    for f in sorted(src.glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            parts = k.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            weights[k] = v
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    return dst


def run(model, prompts, max_tokens, **speculative):
    """``(tokens per row, seconds, tokens per row-step)`` of one batch, to the end."""
    gen = BatchGenerator(model, max_tokens=max_tokens, completion_batch_size=len(prompts),
                         prefill_batch_size=len(prompts), return_logprobs=False,
                         return_caches=False, **speculative)
    tic = time.perf_counter()
    uids = gen.insert(prompts)
    out = {u: [] for u in uids}
    row_steps = 0
    while responses := gen.next_generated():
        row_steps += len({r.uid for r in responses})
        for r in responses:
            out[r.uid].append(r.token)
    gen.close()
    seconds = time.perf_counter() - tic
    tokens = [out[u] for u in uids]
    return tokens, seconds, sum(map(len, tokens)) / max(row_steps, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--draft-model", default=None)
    p.add_argument("--draft-layers", type=int, default=8,
                   help="without --draft-model: the model cut to its first N layers drafts")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[32, 128])
    p.add_argument("--num-draft-tokens", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    path = resolve_model_dir(args.model)
    model, tokenizer = load(path)
    if args.draft_model:
        draft, draft_name = load(resolve_model_dir(args.draft_model))[0], args.draft_model
    else:
        cut = truncated_copy(path, Path("/tmp") / f"bench-draft-{args.draft_layers}-layers",
                             args.draft_layers)
        draft = load(str(cut))[0]
        draft_name = f"first {args.draft_layers} of {len(model.layers)} layers"
    k = args.num_draft_tokens
    methods = {"plain": {}, "draft": {"draft_model": draft, "num_draft_tokens": k},
               "lookup": {"prompt_lookup": True, "num_draft_tokens": k}}
    results = []
    for B in args.batch:
        prompts = build_prompts(tokenizer, B, seed=args.seed, min_len=args.prompt_len[0],
                                max_len=args.prompt_len[1])
        run(model, prompts[:1], 2)  # warm up
        base = None
        for name, options in methods.items():
            tokens, seconds, per_step = run(model, prompts, args.max_tokens, **options)
            total = sum(map(len, tokens))
            base = base or (tokens, seconds)
            row = {"batch": B, "method": name, "seconds": round(seconds, 2),
                   "tokens_per_s": round(total / seconds, 1),
                   "tokens_per_row_step": round(per_step, 2),
                   "speedup": round(base[1] / seconds, 2), "equal_to_plain": tokens == base[0]}
            results.append(row)
            print(json.dumps(row), flush=True)
    report = {"model": args.model, "draft": draft_name, "num_draft_tokens": k,
              "max_tokens": args.max_tokens, "prompt_len": args.prompt_len,
              "machine": machine(), "load_average": os.getloadavg(),
              "device": str(mx.default_device()), "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
