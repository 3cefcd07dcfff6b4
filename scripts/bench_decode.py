#!/usr/bin/env python
"""Decode and prefill side by side, ours against mlx-lm, on prompts of equal length.

    python scripts/bench_decode.py --model /tmp/smollm2-f32 [--batch-sizes 1,4,8,16]
        [--prompt-len 256] [--steps 32] [--repeats 3] [--parts forward,loop] [--skip-mlx-lm]
        [--json out.json]

Equal-length prompts leave no padding to save, so this measures the decode step itself.
Both libraries load the same weights in one process and run interleaved (round-robin
over ``--repeats``, best kept), so the machine's noise hits both alike. Per batch size:

- ``forward``: the bare model call of one decode step (``model(tokens, cache)`` and an
  ``mx.eval`` of the logits), at the same cache length on both sides: mlx-lm's model on
  its ``BatchKVCache`` (what its ``BatchGenerator`` decodes with), ours on the batch
  engine's caches with the engine's per-step arguments.
- ``loop``: decode tokens/s of the whole generation loop as a user runs it: our
  ``stream_batch_generate`` and mlx-lm's ``BatchGenerator`` (the same ``--steps`` tokens
  per row, greedy, no EOS): the tokens after each row's first over the wall time from the
  last row's first token to the end (one clock for both; each library's own "prompt time"
  ends at a different point of its pipelined first step).
  Also the prompt tokens/s of each side's prefill of the B rows (one call of
  ``--prompt-len``).

Columns ``blas``: ours with every matmul through the BLAS (our small-row kernel switched
off, ``mlx_lm_batched._small_gemm``). The header names the CPU, the BLAS
(``MLX_LM_BATCHED_BLAS`` chooses it; process-wide, so mlx-lm multiplies with it too) and
the load average. mlx-lm runs with the BLAS alone, not our kernel, unless
``--mlx-lm-small-gemm`` lends it. A ``.gguf`` model (kept quantized, as ``load`` keeps
it) runs ours alone: mlx-lm does not load GGUF files (its columns show ``-``); compare
with ``scripts/bench_llama_cpp.sh --keep-quant`` on the same file.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench.py, and the working tree's package

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before mlx.core)
import mlx.core as mx  # noqa: E402

from bench import build_prompts, no_eos, run_mlx_lm, run_ours  # noqa: E402
from bench_report import kernels, machine  # noqa: E402
from mlx_lm_batched import _small_gemm, load  # noqa: E402
from mlx_lm_batched.engine.batch_engine import BatchEngine  # noqa: E402


def equal_prompts(tokenizer, batch, length, seed=0):
    """``batch`` distinct corpus prompts of exactly ``length`` tokens."""
    return build_prompts(tokenizer, batch, seed, min_len=length, max_len=length)


def best(times):
    return min(times)


class Ours:
    """Our batch engine's decode step, bare (model call + eval of the logits)."""

    name = "ours"

    def __init__(self, model, prompts):
        self.model = model
        self.engine = BatchEngine(model)
        self.engine.sampling.want_logprobs = False
        self.tokens = mx.array(prompts)

    def prefill(self):
        self.engine = BatchEngine(self.model)
        self.engine.sampling.want_logprobs = False
        self.engine.reserve(512)
        y, _ = self.engine.prefill(self.tokens)
        mx.eval(y)
        self.y = y

    def forward(self):
        e = self.engine
        kwargs = {}
        if e._decode_groups:  # what BatchEngine.step hands the model
            from mlx_lm_batched.layers.step import StepAttention
            kwargs["attention"] = StepAttention(row_groups=e._decode_groups)
        logits = self.model(self.y[:, None], offset=e.offset, cache=e.cache, **kwargs)
        mx.eval(logits)


class OursBlas(Ours):
    """Ours with every matmul through the BLAS (our small-row kernel switched off)."""

    name = "blas"

    def prefill(self):
        with _small_gemm.switched_off():
            super().prefill()

    def forward(self):
        with _small_gemm.switched_off():
            super().forward()


def mlx_lm_side(lend_kernel):
    """The BLAS mlx-lm multiplies with: ours without our small-row kernel, unless
    ``lend_kernel`` (``--mlx-lm-small-gemm``) lends it the kernel too."""
    return contextlib.nullcontext() if lend_kernel else _small_gemm.switched_off()


class Theirs:
    """mlx-lm's model on its ``BatchKVCache`` (no padding), bare."""

    name = "mlx-lm"

    def __init__(self, model, prompts, lend_kernel=False):
        self.model = model
        self.tokens = mx.array(prompts)
        self.lend_kernel = lend_kernel

    def prefill(self):
        with mlx_lm_side(self.lend_kernel):
            self._prefill()

    def forward(self):
        with mlx_lm_side(self.lend_kernel):
            self._forward()

    def _prefill(self):
        from mlx_lm.models.cache import BatchKVCache

        B = self.tokens.shape[0]
        self.cache = [BatchKVCache([0] * B) for _ in self.model.layers]
        # As mlx-lm's BatchGenerator prefills: every column but the last without logits
        # (only the caches are evaluated), then the last one.
        self.model(self.tokens[:, :-1], cache=self.cache)
        mx.eval([c.state for c in self.cache])
        logits = self.model(self.tokens[:, -1:], cache=self.cache)
        self.y = mx.argmax(logits[:, -1], axis=-1)
        mx.eval(self.y)

    def _forward(self):
        logits = self.model(self.y[:, None], cache=self.cache)
        mx.eval(logits)


def time_forward(sides, steps, repeats):
    """Median step seconds of each side's bare forward, best over repeats."""
    out = {s.name: [] for s in sides}
    prefill = {s.name: [] for s in sides}
    for _ in range(repeats):
        for s in sides:
            mx.synchronize()
            tic = time.perf_counter()
            s.prefill()
            prefill[s.name].append(time.perf_counter() - tic)
            s.forward()  # warm-up
            times = []
            for _ in range(steps):
                tic = time.perf_counter()
                s.forward()
                times.append(time.perf_counter() - tic)
            out[s.name].append(sorted(times)[len(times) // 2])
    return {k: best(v) for k, v in out.items()}, {k: best(v) for k, v in prefill.items()}


def time_loop(model, ref, tokenizer, prompts, steps, repeats, bs, lend_kernel=False):
    """Decode tok/s of both generation loops (best over repeats; ours alone without
    ``ref``)."""
    res = {"ours": [], "blas": []} if ref is None else {"ours": [], "blas": [], "mlx-lm": []}
    same = None
    for _ in range(repeats):
        for name in res:
            mx.synchronize()
            tic = time.perf_counter()
            if name == "ours":
                out, timeline, _, _ = run_ours(model, tokenizer, prompts, steps, bs)
            elif name == "blas":
                with _small_gemm.switched_off():
                    out, timeline, _, _ = run_ours(model, tokenizer, prompts, steps, bs)
            else:
                with mlx_lm_side(lend_kernel):
                    out, timeline, _, _ = run_mlx_lm(ref, prompts, steps, bs)
            wall = time.perf_counter() - tic
            # The same clock for both: from the moment every row has its first token
            # (prefill done, whatever each library counts as prompt time) to the end.
            decoded = sum(len(o) for o in out) - len(out)
            res[name].append(decoded / max(wall - max(timeline.first.values()), 1e-9))
            if name == "ours":
                mine = out
            elif name == "mlx-lm":
                same = sum(a == b for a, b in zip(mine, out)) / len(out)
    return {k: max(v) for k, v in res.items()}, same


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="/tmp/smollm2-f32")
    p.add_argument("--batch-sizes", default="1,4,8,16")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parts", default="forward,loop")
    p.add_argument("--json")
    p.add_argument("--skip-mlx-lm", action="store_true",
                   help="ours only (mlx-lm's CPU quantized matmul decodes at about 1 tok/s)")
    p.add_argument("--mlx-lm-small-gemm", action="store_true",
                   help="lend mlx-lm our small-row matmul kernel too (default: its BLAS only)")
    args = p.parse_args(argv)
    import mlx_lm

    model, tokenizer = load(args.model)
    tokenizer = no_eos(tokenizer)
    ref = None if args.model.endswith(".gguf") or args.skip_mlx_lm else mlx_lm.load(args.model)[0]
    parts = args.parts.split(",")
    load_start = os.getloadavg()
    print(f"{machine()}; BLAS: {kernels()}; load average {load_start[0]:.2f}; "
          f"prompts of {args.prompt_len} tokens, {args.steps} decode steps, "
          f"best of {args.repeats} interleaved")
    print(f"{'bs':>3s} {'fwd ours ms':>11s} {'blas':>7s} {'fwd mlx ms':>10s} {'fwd x':>6s} "
          f"{'pf ours t/s':>11s} {'blas':>7s} {'pf mlx t/s':>10s} {'pf x':>5s} "
          f"{'loop ours t/s':>13s} {'blas':>6s} {'loop mlx t/s':>12s} {'loop x':>6s} {'=mlx':>5s}")
    rows = []
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = equal_prompts(tokenizer, bs, args.prompt_len)
        row = {"bs": bs}
        if "forward" in parts:
            sides = [Ours(model, prompts), OursBlas(model, prompts)]
            if ref is not None:
                sides.append(Theirs(ref, prompts, args.mlx_lm_small_gemm))
            fwd, pf = time_forward(sides, args.steps, args.repeats)
            row.update(fwd_ours_ms=fwd["ours"] * 1e3, fwd_blas_ms=fwd["blas"] * 1e3,
                       prefill_ours_tps=bs * args.prompt_len / pf["ours"],
                       prefill_blas_tps=bs * args.prompt_len / pf["blas"])
            if ref is not None:
                row.update(fwd_mlx_ms=fwd["mlx-lm"] * 1e3,
                           prefill_mlx_tps=bs * args.prompt_len / pf["mlx-lm"])
        if "loop" in parts:
            loop, same = time_loop(model, ref, tokenizer, prompts, args.steps, args.repeats, bs,
                                   args.mlx_lm_small_gemm)
            row.update(loop_ours_tps=loop["ours"], loop_blas_tps=loop["blas"])
            if ref is not None:
                row.update(loop_mlx_tps=loop["mlx-lm"], same=same)
        rows.append(row)

        def f(key, fmt, width):
            return format(row[key], fmt).rjust(width) if key in row else "-".rjust(width)

        def ratio(a, b, width, inverse=False):
            if a not in row or b not in row:
                return "-".rjust(width)
            x = row[b] / row[a] if inverse else row[a] / row[b]
            return f"{x:.2f}".rjust(width)

        print(f"{bs:3d} {f('fwd_ours_ms', '.1f', 11)} {f('fwd_blas_ms', '.1f', 7)} "
              f"{f('fwd_mlx_ms', '.1f', 10)} "
              f"{ratio('fwd_ours_ms', 'fwd_mlx_ms', 6, True)} "
              f"{f('prefill_ours_tps', '.0f', 11)} {f('prefill_blas_tps', '.0f', 7)} "
              f"{f('prefill_mlx_tps', '.0f', 10)} "
              f"{ratio('prefill_ours_tps', 'prefill_mlx_tps', 5)} "
              f"{f('loop_ours_tps', '.1f', 13)} {f('loop_blas_tps', '.1f', 6)} "
              f"{f('loop_mlx_tps', '.1f', 12)} "
              f"{ratio('loop_ours_tps', 'loop_mlx_tps', 6)} "
              f"{f('same', '.0%', 5)}", flush=True)
    load_end = os.getloadavg()
    print(f"load average at end {load_end[0]:.2f}; 'x' columns: ours over mlx-lm "
          "(speed; above 1 is ours faster)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine(), "blas": kernels(), "load_start": load_start,
            "load_end": load_end, "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
