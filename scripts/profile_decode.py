#!/usr/bin/env python
"""Where the time of one batched decode step goes.

    python scripts/profile_decode.py --model /tmp/smollm2-f32 [--batch 32] [--steps 8]

Prefills a batch of corpus prompts (the ones ``bench.py`` uses), then times:

- the whole step as ``batch_generate`` runs it (pipelined with ``mx.async_eval``)
  and the same step synchronised every time (host sync cost);
- building the graph alone (Python and MLX graph construction, no compute);
- each kind of work of the step, run in isolation at the step's exact shapes:
  projections (matmuls), attention, norms/RoPE/activations (elementwise), cache
  writes, mask building, logits and sampling, and the per-row Python of the driver.

The isolated parts don't add up exactly to the step (MLX overlaps and fuses some
of them); the difference is reported as "unattributed".
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench.py, and the working tree's package

import mlx_lm_batched  # noqa: E402,F401  (BLAS preload before mlx.core)
import mlx.core as mx  # noqa: E402

from bench import build_prompts, no_eos  # noqa: E402
from bench_report import machine  # noqa: E402
from mlx_lm_batched import _blas, _small_gemm, load  # noqa: E402
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad  # noqa: E402
from mlx_lm_batched.layers import attention as layers_lib  # noqa: E402
from mlx_lm_batched.layers import cpu_ops  # noqa: E402
from mlx_lm_batched.layers import masks as masks_lib  # noqa: E402


def timed(fn, repeats):
    """Median seconds of ``fn()`` (which must evaluate its own work)."""
    fn()  # warm up
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return sorted(times)[len(times) // 2]


def thread_cpu_seconds():
    """``{thread id: CPU seconds so far}`` for this process's threads (Linux ``/proc``:
    ``schedstat``'s nanoseconds where the kernel keeps them, else ``stat``'s ticks)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return out


def cpu_by_thread(run, steps):
    """CPU seconds per step of each kind of thread while ``run()`` does ``steps``
    steps, and the wall seconds per step. Kinds: the Python thread (graph building,
    ``eval``'s walk over the graph, allocating outputs), MLX's CPU stream thread (every
    op; it also computes its share of the small-row kernel's products), the kernel's
    OpenMP workers (their share, then spinning until the next product), and the rest
    (the BLAS's workers). Empty off Linux."""
    if not os.path.isdir("/proc/self/task"):
        return {}, 0.0
    before = thread_cpu_seconds()
    tic = time.perf_counter()
    run()
    wall = time.perf_counter() - tic
    after = thread_cpu_seconds()
    team = _small_gemm.team_thread_ids()
    kinds = {}
    for tid, seconds in after.items():
        if tid == os.getpid():
            kind = "Python thread"
        elif team and tid == team[0]:
            kind = "MLX CPU stream thread"
        elif tid in team:
            kind = "small-row kernel workers"
        else:
            kind = "other threads (BLAS workers)"
        kinds[kind] = kinds.get(kind, 0.0) + (seconds - before.get(tid, 0.0)) / steps
    return kinds, wall / steps


def linear_weights(model):
    """``(name, weight)`` of every projection one decode step multiplies by."""
    out = []
    for i, layer in enumerate(model.layers):
        for part in ("self_attn", "mlp"):
            module = getattr(layer, part, None)
            for name, child in (module.children().items() if module is not None else []):
                if hasattr(child, "weight") and child.weight.ndim == 2:
                    out.append((f"{i}.{part}.{name}", child))
    return out


def head_module(model):
    """The module whose weight is the LM head: ``lm_head``, or the tied embedding."""
    return model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens


def input_width(linear):
    """A linear layer's input features: a quantized weight packs 32 / bits values a word."""
    width = linear.weight.shape[1]
    return width * 32 // linear.bits if hasattr(linear, "bits") else width


def stored_bytes(layer):
    """The bytes a layer's matmul reads: the weight, and a quantized one's scales and biases."""
    return sum(layer[name].nbytes for name in ("weight", "scales", "biases") if name in layer)


def profile(model, tokenizer, batch, steps, repeats):
    prompts = sorted(build_prompts(tokenizer, batch, seed=0), key=len)  # as batch_generate
    tokens, padding = left_pad(prompts)
    engine = BatchEngine(model)
    engine.sampling.want_logprobs = False  # as batch_generate without return_logprobs
    engine.reserve(64)
    y, _ = engine.prefill(tokens, padding)
    mx.eval(y)
    for _ in range(4):  # a few steps so the cache is in its decode layout
        y, _ = engine.step(y)
        mx.eval(y)
    B = y.shape[0]
    args = model.args
    H, D = args.num_attention_heads, args.hidden_size // args.num_attention_heads
    n_kv = getattr(args, "num_key_value_heads", None) or H
    S = engine.slots + 1
    results, extra = {}, {}

    def pipelined():
        nonlocal y
        cur = y
        for _ in range(steps):
            nxt, lp = engine.step(cur)
            mx.async_eval(nxt)
            cur.tolist()  # the driver reads the previous step's tokens meanwhile
            cur = nxt
        mx.eval(cur)
        y = cur

    def synced():
        nonlocal y
        for _ in range(steps):
            y, lp = engine.step(y)
            mx.eval(y)
            y.tolist()

    results["step, pipelined (as batch_generate)"] = timed(pipelined, repeats) / steps
    results["step, synced every step"] = timed(synced, repeats) / steps
    extra["cpu by thread"] = cpu_by_thread(lambda: [synced() for _ in range(repeats)],
                                           steps * repeats)
    # The same step with attention in one call over all slots (no row groups).
    groups, engine._decode_groups = engine._decode_groups, None
    extra["step, attention not grouped by rows"] = timed(pipelined, repeats) / steps
    engine._decode_groups = groups

    def build_only():
        # Graph construction only; the cache is rolled back so it doesn't grow.
        engine.step(y)
        engine.cache.trim(1)

    results["graph building (Python, no compute)"] = timed(build_only, repeats * 3)

    x = mx.random.normal((B, 1, args.hidden_size))
    lins = linear_weights(model)
    inputs = {}
    for name, lin in lins:
        inputs.setdefault(input_width(lin), mx.random.normal((B, 1, input_width(lin))))
    mx.eval(x, list(inputs.values()))
    results["projections (all layers' matmuls)"] = timed(
        lambda: mx.eval([cpu_ops.linear(lin, inputs[input_width(lin)]) for _, lin in lins]),
        repeats)
    head = head_module(model)
    extra["weights read by the matmuls (MB)"] = (
        sum(stored_bytes(lin) for _, lin in lins) + stored_bytes(head)) / 1e6
    # As the model calls them: cpu_ops routes float32 and quantized layers to the primitives.
    results["lm head (vocab matmul)"] = timed(
        lambda: mx.eval(cpu_ops.tied_logits(model.model.embed_tokens, x)
                        if not hasattr(model, "lm_head") else cpu_ops.linear(model.lm_head, x)),
        repeats)
    logits = mx.random.normal((B, args.vocab_size))
    mx.eval(logits)
    results["argmax (greedy sampling)"] = timed(lambda: mx.eval(mx.argmax(logits, -1)), repeats)
    extra["log-softmax over the vocabulary (skipped)"] = timed(
        lambda: mx.eval(logits - mx.logsumexp(logits, -1, keepdims=True)), repeats)

    q = mx.random.normal((B, H, 1, D))
    k = mx.random.normal((B, n_kv, S, D))
    v = mx.random.normal((B, n_kv, S, D))
    offset = engine.offset
    mask = masks_lib.attention_mask(mx.arange(S), S - 1, 1, offset)
    mx.eval(q, k, v, mask)
    n_layers = len(model.layers)
    results["attention (all layers)"] = timed(
        lambda: mx.eval([layers_lib.scaled_dot_product_attention(q, k, v, D**-0.5, mask)
                         for _ in range(n_layers)]), repeats)
    extra["attention with mx.fast's CPU fallback"] = timed(
        lambda: mx.eval([mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)
                         for _ in range(n_layers)]), repeats)
    results["mask building (once per step)"] = timed(
        lambda: mx.eval(masks_lib.masks_for_layers(engine.cache, model.layer_windows, 1, offset)),
        repeats)

    layer = model.layers[0]
    rope = layer.self_attn.rope
    qk = mx.random.normal((B, H + n_kv, 1, D))
    h = mx.random.normal((B, 1, args.intermediate_size))
    mx.eval(qk, h)

    def elementwise():
        outs = []
        for lyr in model.layers:
            outs += [lyr.input_layernorm(x), lyr.post_attention_layernorm(x), rope(qk, offset),
                     lyr.mlp.act(h) * h, x + x, x + x]
        mx.eval(outs)

    results["norms, RoPE, activations, residuals"] = timed(elementwise, repeats)

    cache = [mx.zeros((B, n_kv, S + 256, D)) for _ in range(2 * n_layers)]
    new = mx.random.normal((B, n_kv, 1, D))
    mx.eval(cache, new)

    def cache_writes():
        for i, c in enumerate(cache):
            c[..., S : S + 1, :] = new
            cache[i] = c
        mx.eval(cache)

    results["cache writes (slice updates)"] = timed(cache_writes, repeats)

    detoks = [tokenizer.make_detokenizer() for _ in range(B)]
    ids = y.tolist()

    def per_row_python():
        for d, t in zip(detoks, ids):
            d.add_token(t)
            _ = d.last_segment

    results["driver per-row Python (detokenize)"] = timed(per_row_python, repeats)
    return results, extra, B, S


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dequantize", action="store_true")
    args = p.parse_args(argv)
    kwargs = {"dequantize": True} if args.dequantize else {}
    model, tokenizer = load(args.model, **kwargs)
    results, extra, B, S = profile(model, no_eos(tokenizer), args.batch, args.steps, args.repeats)
    step = results["step, pipelined (as batch_generate)"]
    print(f"decode step, batch {B}, {S} cache slots ({machine()}; BLAS: {_blas.describe()})")
    parts = 0.0
    for name, t in results.items():
        share = f"{100 * t / step:5.1f}%"
        print(f"  {name:40s} {1e3 * t:8.2f} ms  {share}")
        if not name.startswith(("step", "graph")):
            parts += t
    print(f"  {'unattributed (step - isolated parts)':40s} {1e3 * (step - parts):8.2f} ms")
    print("not in the step, for reference:")
    weights_mb = extra.pop("weights read by the matmuls (MB)")
    by_thread, wall = extra.pop("cpu by thread")
    for name, t in extra.items():
        print(f"  {name:40s} {1e3 * t:8.2f} ms")
    # Decode at small batch sizes streams every weight once per step: this rate is
    # the memory bandwidth the matmuls reach, and bounds tokens/s per row.
    matmul_s = results["projections (all layers' matmuls)"] + results["lm head (vocab matmul)"]
    print(f"  {'weights streamed by the matmuls':40s} {weights_mb:8.1f} MB "
          f"({weights_mb / 1e3 / matmul_s:.1f} GB/s in the isolated matmuls)")
    if by_thread:
        # Two cores give 2x the wall time; a thread near 100% of it holds a core.
        print(f"CPU time per synced step by thread (step {1e3 * wall:.2f} ms wall; "
              f"{os.cpu_count()} CPUs):")
        for kind, seconds in sorted(by_thread.items(), key=lambda kv: -kv[1]):
            print(f"  {kind:40s} {1e3 * seconds:8.2f} ms  {100 * seconds / wall:5.1f}% of the wall")


if __name__ == "__main__":
    main()
