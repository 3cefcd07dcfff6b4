#!/usr/bin/env python
"""One process against 2 ranks (tensor and pipeline parallel) on one machine.

    python scripts/bench_distributed.py --model DIR [--batch-sizes 1,2,4,8,16,32]
        [--prompt-len 8] [--max-tokens 16] [--modes single,tensor,pipeline,pipeline-m1]
        [--json docs/data/distributed-MACHINE-DATE.json]

Each mode is a fresh process (``single``) or 2 ring ranks on 127.0.0.1 started with
``mlx.launch`` (``tensor``: heads and MLP columns split; ``pipeline``: layers split, the
rows of each decode step in 2 micro-batches; ``pipeline-m1``: one micro-batch, to see
whether the stages' micro-batches overlap). Per batch size: ``B`` random prompts of
``--prompt-len`` tokens, prefilled, then ``--max-tokens`` greedy decode steps, each
evaluated on its own; reported are the mean decode step time (after the first) and, per
step, the bytes the ranks received over TCP (the kernel's ``tcpi_bytes_received`` of each
rank's sockets: the collectives' payload on the wire), summed over the ranks. The tokens
of every mode are compared with the single process's.

``--volume`` prints the per-step communication computed for larger models (no run).
"""

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("single", "tensor", "pipeline", "pipeline-m1")
# Dense models for the computed table: (layers, hidden, vocab).
MODELS = {"SmolLM2-135M": (30, 576, 49152), "Llama-3-8B": (32, 4096, 128256),
          "Llama-3-70B": (80, 8192, 128256)}


def tcp_received():
    """Payload bytes this process's TCP sockets have received (Linux ``TCP_INFO``
    ``tcpi_bytes_received``): the collectives' traffic into this rank."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.fromfd(int(fd), socket.AF_INET, socket.SOCK_STREAM)  # a duplicate fd
        except OSError:
            continue
        try:
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
            if len(info) >= 136:
                total += struct.unpack_from("Q", info, 128)[0]
        except OSError:  # not a TCP socket
            pass
        finally:
            s.close()
    return total


def worker(args):
    """One rank (or the single process): time the decode steps, write rank 0's result."""
    import mlx_lm_batched  # noqa: F401  (BLAS preload before mlx.core)
    import mlx.core as mx
    import numpy as np

    from mlx_lm_batched.engine.batch_engine import BatchEngine
    from mlx_lm_batched.parallel.load import finish_sharding
    from mlx_lm_batched.parallel.pipeline import pipeline_model
    from mlx_lm_batched.utils import load

    mode = args.worker
    group = None if mode == "single" else mx.distributed.init()
    model, _ = load(args.model, lazy=group is not None)
    if mode == "tensor":
        finish_sharding(model, group)
    elif mode.startswith("pipeline"):
        pipeline_model(model, group, micro_batches=1 if mode == "pipeline-m1" else 2)
        mx.eval(model.parameters())
        mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu, group=group))
    if mode.startswith("pipeline"):
        s = model.stage
        layers, hidden, vocab, itemsize = s.n_layers, s.hidden, s.vocab, s.logits_dtype.size
    else:
        emb = model.model.embed_tokens.weight
        layers, (vocab, hidden), itemsize = len(model.layers), emb.shape, emb.dtype.size
    rng = np.random.default_rng(0)
    rows = []
    for B in args.batch_sizes:
        tokens = mx.array(rng.integers(3, min(vocab, 2000), (B, args.prompt_len)), mx.int32)
        engine = BatchEngine(model)
        engine.reserve(args.max_tokens)
        tic = time.perf_counter()
        y, _ = engine.prefill(tokens)
        mx.eval(y)
        prefill_s = time.perf_counter() - tic
        out, times, written = [y], [], []
        for _ in range(args.max_tokens - 1):
            w, tic = tcp_received(), time.perf_counter()
            y, _ = engine.step(y)
            mx.eval(y)
            times.append(time.perf_counter() - tic)
            written.append(tcp_received() - w)
            out.append(y)
        steps = times[1:] or times
        sent = float(np.mean(written[1:] or written))
        if group is not None:  # every rank's traffic, summed
            sent = mx.distributed.all_sum(mx.array(sent), group=group, stream=mx.cpu).item()
        rows.append(dict(batch_size=B, prefill_s=prefill_s, step_ms=1000 * float(np.mean(steps)),
                         bytes_per_step=sent,
                         computed_bytes=traffic(mode, B, layers, hidden, vocab, itemsize),
                         tokens=np.array(mx.stack(out, axis=1)).tolist()))
    if group is None or group.rank() == 0:
        Path(args.result).write_text(json.dumps(rows))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher():
    beside = Path(sys.executable).with_name("mlx.launch")
    return str(beside) if beside.exists() else shutil.which("mlx.launch") or "mlx.launch"


def run_mode(mode, args):
    """Rows of one mode, run in a fresh process (or 2 ranks)."""
    with tempfile.TemporaryDirectory() as d:
        result = Path(d) / "rows.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--model",
               args.model, "--batch-sizes", ",".join(map(str, args.batch_sizes)),
               "--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens),
               "--result", str(result)]
        if mode != "single":
            cmd = [launcher(), "-n", "2", "--backend", "ring", "--starting-port",
                   str(free_port()), "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0 or not result.exists():
            raise SystemExit(f"bench_distributed: mode {mode} failed:\n{proc.stderr[-3000:]}")
        return json.loads(result.read_text())


def traffic(mode, B, layers, hidden, vocab, itemsize, ranks=2):
    """Bytes all ranks send per decode step (see :func:`volume`); 0 for one process."""
    ring = 2 * (ranks - 1)  # payloads sent per all-reduce, all ranks together
    if mode == "tensor":
        return 2 * layers * ring * B * hidden * itemsize
    if mode.startswith("pipeline"):
        return (ranks - 1) * B * hidden * itemsize + ring * B * vocab * itemsize
    return 0


def volume(batch_sizes, ranks=2, dtype_bytes=2, micro_batches=2):
    """Computed per-step traffic (bytes all ranks send together) for ``MODELS``.

    Tensor: 2 all-reduces of ``(B, hidden)`` per layer; a ring all-reduce makes each of
    the N ranks send ``2 (N-1)/N`` times the payload. Pipeline: ``N-1`` hops of
    ``(B, hidden)`` (one sender each) plus one all-reduce of the ``(B, vocab)`` logits.
    Messages: rounds on the critical path of one step (each costs a network latency).
    """
    ring = 2 * (ranks - 1)
    out = []
    for name, (layers, hidden, vocab) in MODELS.items():
        for B in batch_sizes:
            tensor = traffic("tensor", B, layers, hidden, vocab, dtype_bytes, ranks)
            pipe = traffic("pipeline", B, layers, hidden, vocab, dtype_bytes, ranks)
            out.append(dict(model=name, batch_size=B, ranks=ranks, tensor_bytes=tensor,
                            pipeline_bytes=pipe, tensor_rounds=2 * layers * ring,
                            pipeline_rounds=(ranks - 1) * min(B, micro_batches) + ring))
    return out


def mb(x):
    return f"{x / 1e6:.2f}"


def print_tables(result, file=sys.stdout):
    print(f"model {result['model']}  ({result['machine']}); prompts of {result['prompt_len']} "
          f"tokens, {result['max_tokens']} greedy steps; 2 ranks share this machine's cores",
          file=file)
    print(f"{'mode':12s} {'bs':>3s} {'step ms':>8s} {'x single':>8s} {'MB/step':>8s} "
          f"{'computed':>8s} {'=single':>7s}", file=file)
    single = {r["batch_size"]: r for r in result["runs"].get("single", [])}
    for mode, rows in result["runs"].items():
        for r in rows:
            base = single.get(r["batch_size"])
            ratio = f"{r['step_ms'] / base['step_ms']:8.2f}" if base else f"{'':8s}"
            same = r.get("same_tokens_as_single")
            same = f"{100 * same:6.0f}%" if same is not None else f"{'':7s}"
            print(f"{mode:12s} {r['batch_size']:3d} {r['step_ms']:8.1f} {ratio} "
                  f"{mb(r['bytes_per_step']):>8s} {mb(r['computed_bytes']):>8s} {same}", file=file)
    print("\ncomputed traffic per decode step, 2 ranks, bf16 activations (MB, all ranks; "
          "rounds: latencies on the critical path)", file=file)
    print(f"{'model':14s} {'bs':>3s} {'tensor MB':>9s} {'pipeline MB':>11s} {'tensor rounds':>13s} "
          f"{'pipeline rounds':>15s}", file=file)
    for v in result["computed"]:
        print(f"{v['model']:14s} {v['batch_size']:3d} {mb(v['tensor_bytes']):>9s} "
              f"{mb(v['pipeline_bytes']):>11s} {v['tensor_rounds']:13d} {v['pipeline_rounds']:15d}",
              file=file)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model directory (e.g. the SmolLM2 float32 test fixture)")
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--volume", action="store_true", help="print the computed table only")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per mode")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        p.error(f"--modes: unknown {', '.join(bad)}; choose from {', '.join(MODES)}")
    if not args.volume and not args.model:
        p.error("--model is required (unless --volume)")
    if args.max_tokens < 2 or args.prompt_len < 1 or min(args.batch_sizes) < 1:
        p.error("--max-tokens must be >= 2, --prompt-len and every batch size >= 1")
    return args


def main(argv=None):
    args = parse(argv)
    if args.worker:
        return worker(args)
    computed = volume([1, 8, 32] if args.volume else args.batch_sizes)
    if args.volume:
        return print_tables(dict(model="-", machine="-", prompt_len=0, max_tokens=0, runs={},
                                 computed=computed))
    from bench_report import machine

    runs, load = {}, {}
    for mode in args.modes:  # the machine's load average around each mode (a shared machine)
        before = os.getloadavg()[0]
        runs[mode] = run_mode(mode, args)
        load[mode] = [round(before, 2), round(os.getloadavg()[0], 2)]
    single = {r["batch_size"]: r["tokens"] for r in runs.get("single", [])}
    for mode, rows in runs.items():
        for r in rows:
            ref = single.get(r["batch_size"])
            if ref is not None and mode != "single":
                r["same_tokens_as_single"] = sum(a == b for a, b in zip(r["tokens"], ref)) / len(ref)
    result = dict(model=str(args.model), machine=machine(), prompt_len=args.prompt_len,
                  max_tokens=args.max_tokens, runs=runs, computed=computed, load_average=load)
    print_tables(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
