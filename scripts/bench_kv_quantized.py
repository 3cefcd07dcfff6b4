#!/usr/bin/env python
"""Quantized KV caches: memory per token and decode speed at 4 and 8 bits against float.

    python scripts/bench_kv_quantized.py --model /tmp/smollm2-f32 [--rows 8]
        [--prompt-len 512] [--new-tokens 32] [--bits none,8,4] [--json out.json]

For each setting the same ``--rows`` prompts of ``--prompt-len`` tokens (cut from
tests/data/corpus.txt) generate ``--new-tokens`` tokens greedily with ``batch_generate``
(no EOS stop; ``quantized_kv_start=0``). Reported: KV bytes per token of one row (the
held key/value arrays of every layer, from the returned caches), the whole batch's KV
bytes at the end, decode tokens/s and prefill tokens/s (``BatchStats``), and the share of
each row's tokens equal to the float run's.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before anything imports mlx.core)

from bench import build_prompts, no_eos, resolve_model_dir  # noqa: E402
from bench_report import machine  # noqa: E402
from mlx_lm_batched import batch_generate, load  # noqa: E402


def held_bytes(cache):
    return sum(x.nbytes for c in cache for x in c.state)


def run(model, tokenizer, prompts, new_tokens, bits):
    out = batch_generate(model, tokenizer, prompts, max_tokens=new_tokens, kv_bits=bits,
                         quantized_kv_start=0, return_prompt_caches=True, return_token_ids=True)
    per_token = [held_bytes(c) / c[0].size for c in out.caches]
    return {
        "kv_bits": bits,
        "kv_bytes_per_token": round(sum(per_token) / len(per_token)),
        "batch_kv_bytes": sum(held_bytes(c) for c in out.caches),
        "decode_tps": round(out.stats.generation_tps, 1),
        "prefill_tps": round(out.stats.prompt_tps, 1),
    }, out.token_ids


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory or .gguf file")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--bits", default="none,8,4")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    model, tokenizer = load(resolve_model_dir(args.model))
    tokenizer = no_eos(tokenizer)
    prompts = build_prompts(tokenizer, args.rows, min_len=args.prompt_len,
                            max_len=args.prompt_len)
    run(model, tokenizer, prompts[:1], 2, None)  # warm-up
    results, reference = [], None
    for b in args.bits.split(","):
        bits = None if b == "none" else int(b)
        result, ids = run(model, tokenizer, prompts, args.new_tokens, bits)
        reference = reference or ids
        result["same_tokens"] = round(sum(
            sum(x == y for x, y in zip(a, r)) / len(r) for a, r in zip(ids, reference)
        ) / len(ids), 3)
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine(), "rows": args.rows, "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens, "results": results}, indent=1))


if __name__ == "__main__":
    main()
