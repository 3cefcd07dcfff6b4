#!/usr/bin/env python
"""Our server against ``mlx_lm.server`` on the arrival trace of ``bench_continuous.py``.

    python scripts/bench_server.py --model DIR [--requests 64] [--rate 1.0]
        [--prompt-len 16 512] [--output-len 16 256] [--seed 0] [--servers ours,mlx-lm]
        [--json out.json] [--plot out.png]
    python scripts/bench_server.py --model DIR --fixed-len 256 64 --concurrency 1 4 16
        [--requests-per-stream 4] [--json out.json]

The second form is the fixed serving workload: every prompt ``P`` tokens,
every output ``O`` tokens, and for each concurrency ``C`` a closed loop of ``C`` streams,
each sending its next request as soon as its previous one finishes
(``C * --requests-per-stream`` requests per level, all at once, no arrival trace); each
server is started once and swept through the levels in order.

The trace (``bench_continuous.make_trace``: seeded Poisson arrivals, prompt and output
lengths) is replayed in real time over HTTP (asyncio + httpx, streamed
``/v1/completions``) to each server in turn, each a subprocess on 127.0.0.1 on the same
model directory, one run each after a one-request warm-up.

Prompts: ``mlx_lm.server`` accepts text prompts only (it calls ``tokenizer.encode``), so
each trace prompt is decoded to text and re-encoded the way mlx-lm does; ours gets those
token ids and mlx-lm the text, so both prefill identical tokens (checked against each
response's ``usage.prompt_tokens``). No chat template. Exact output lengths: ``max_tokens``
is the trace's output length and a ``logit_bias`` of -100 on every EOS id (neither server
has an ``ignore_eos``) keeps greedy decoding from stopping early; both servers get the same
bias, so their greedy outputs are comparable (``=mlx-lm``: share of identical texts,
leading whitespace aside). mlx-lm runs with the same CPU BLAS as ours unless
``--mlx-lm-bundled-blas``.

Reported per server: requests/s and output tokens/s over the replay (first arrival to last
token; tokens from ``usage.completion_tokens``), time to first token (request sent to the
first streamed text) p50/p95 and inter-chunk latency p50/p95 (about one token per chunk),
and the requests sent again after their connection failed before any response
(:data:`CONNECTION_RETRIES`).
"""

import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from bench_continuous import (  # noqa: E402
    check_trace_args,
    make_trace,
    report,
    trace_parser,
)
from bench_continuous import plot as plot_trace  # noqa: E402
from bench_report import attention, machine  # noqa: E402

SERVERS = {"ours": "mlx_lm_batched.server", "mlx-lm": "mlx_lm.server"}
START_TIMEOUT_S = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, model, batch_size, same_blas=True, same_malloc=True, ours_args=()):
    """Start server ``name`` on a free port; ``(process, url, log file)`` once it answers.

    With ``same_blas``, mlx_lm.server runs after ``import mlx_lm_batched`` has preloaded
    the fast CPU BLAS (see ``mlx_lm_batched._blas``), so both servers multiply with the
    same library; without it mlx-lm runs as shipped (MLX's bundled BLAS on Linux CPUs).
    That import also sets glibc's malloc thresholds (``mlx_lm_batched._malloc``);
    without ``same_malloc`` mlx-lm keeps glibc's defaults, as when run as shipped. mlx-lm
    never gets our small-row matmul kernel (``mlx_lm_batched._small_gemm``): that is
    ours, not the BLAS.
    """
    port = free_port()
    launch = ["-m", SERVERS[name]]
    if name == "mlx-lm" and same_blas:
        launch = ["-c", "import sys, runpy, mlx_lm_batched; sys.argv[0] = 'mlx_lm.server'; "
                        "runpy.run_module('mlx_lm.server', run_name='__main__')"]
    cmd = [sys.executable, *launch, "--model", str(model), "--port", str(port)]
    # The same decode and prefill widths on both sides (mlx-lm's defaults: 32 and 8).
    cmd += (["--max-batch", str(batch_size), "--prefill-batch", "8", "--log-level", "warning"]
            if name == "ours" else
            ["--decode-concurrency", str(batch_size), "--prompt-concurrency", "8",
             "--log-level", "WARNING"])
    if name == "ours":
        cmd += list(ours_args)
    env = dict(os.environ)
    if name == "mlx-lm":
        env["MLX_LM_BATCHED_SMALL_GEMM"] = "off"
    if name == "mlx-lm" and not same_malloc:
        env["MLX_LM_BATCHED_MALLOC"] = "system"
    log = tempfile.NamedTemporaryFile("w+", suffix=f"-{name}.log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{SERVERS[name]} exited with {proc.returncode}: "
                               f"{Path(log.name).read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2).read()  # both serve it
            return proc, url, log.name
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{SERVERS[name]} did not answer /v1/models in {START_TIMEOUT_S} s")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def eos_ids(model_dir, tokenizer):
    """Every id either server may stop on: the tokenizer's EOS and the configs' ``eos_token_id``."""
    ids = {tokenizer.eos_token_id} - {None}
    for name in ("config.json", "generation_config.json"):
        f = Path(model_dir) / name
        if f.exists():
            e = json.loads(f.read_text()).get("eos_token_id")
            ids.update(e if isinstance(e, list) else [e] if e is not None else [])
    return sorted(ids)


# Requests whose connection failed before any response came (httpx.ReadError and kin)
# are sent again, up to this many times, as the official OpenAI client retries
# connection errors (twice by default). Their time to first token counts from the first
# attempt, and each server's count of retries is reported. mlx_lm.server (Python's
# ThreadingHTTPServer, a listen backlog of 5) reset some of 16 simultaneous new
# connections in two runs on 2026-12-04, ending them before any table.
CONNECTION_RETRIES = 3


async def one(http, name, model, req, bias, start_at):
    """Send one request at its arrival time; its chunk times, text, usage and the
    connection retries it took."""
    import httpx

    await asyncio.sleep(max(0.0, start_at + req["arrival"] - time.perf_counter()))
    body = {"model": "default_model" if name == "mlx-lm" else str(model), "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0,
            "max_tokens": req["max_tokens"], "logit_bias": bias,
            "prompt": req["text"] if name == "mlx-lm" else req["ids"]}
    sent = time.perf_counter()
    for retries in range(CONNECTION_RETRIES + 1):
        times, text, usage, answered = [], "", None, False
        try:
            async with http.stream("POST", "/v1/completions", json=body) as r:
                answered = True
                if r.status_code != 200:
                    raise RuntimeError(f"{name}: HTTP {r.status_code}: "
                                       f"{(await r.aread())[:500]!r}")
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    data = json.loads(line[5:])
                    usage = data.get("usage") or usage
                    for choice in data.get("choices") or []:
                        delta = choice.get("text") or (choice.get("delta") or {}).get("content")
                        if delta:
                            times.append(time.perf_counter())
                            text += delta
            break
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
            if answered or retries == CONNECTION_RETRIES:
                raise  # a response had begun, or the server keeps refusing: a real failure
    return {"sent": sent - start_at, "times": [t - start_at for t in times], "text": text,
            "usage": usage or {}, "retries": retries}


async def replay(name, url, model, trace, bias):
    import httpx

    limits = httpx.Limits(max_connections=len(trace) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as http:
        warm = {"arrival": 0.0, "max_tokens": 2, "ids": trace[0]["ids"][:8],
                "text": trace[0]["text"]}
        await one(http, name, model, warm, bias, time.perf_counter())
        start_at = time.perf_counter()
        return await asyncio.gather(*(one(http, name, model, r, bias, start_at) for r in trace))



async def closed_loop(name, url, model, trace, bias, streams):
    """``streams`` concurrent streams working through ``trace`` back to back (arrival
    times ignored); per-request results in trace order."""
    import httpx

    # A new connection per request, for both servers: mlx_lm.server closes a connection
    # after its response, and a request sent on it meanwhile died with a reset
    # (httpx.ReadError) in two of three runs at 4 and 16 streams (2026-12-03).
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as http:
        warm = {"arrival": 0.0, "max_tokens": 2, "ids": trace[0]["ids"][:8],
                "text": trace[0]["text"]}
        await one(http, name, model, warm, bias, time.perf_counter())
        order, results = iter(range(len(trace))), [None] * len(trace)
        start_at = time.perf_counter()

        async def stream():
            for i in order:  # one shared iterator: each request is taken by one stream
                results[i] = await one(http, name, model, {**trace[i], "arrival": 0.0}, bias,
                                       start_at)

        await asyncio.gather(*(stream() for _ in range(streams)))
        return results

def summarize(trace, results):
    """Throughput and latency percentiles of one server's replay."""
    end = max(r["times"][-1] if r["times"] else r["sent"] for r in results)
    generated = sum(r["usage"].get("completion_tokens", 0) for r in results)
    ttft = [r["times"][0] - r["sent"] for r in results if r["times"]]
    itl = [b - a for r in results for a, b in zip(r["times"], r["times"][1:])]
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else 0.0  # noqa: E731
    return {
        "wall_s": end, "requests_per_s": len(trace) / end, "output_tps": generated / end,
        "generated": generated, "expected": sum(r["max_tokens"] for r in trace),
        "complete": sum(r["usage"].get("completion_tokens") == q["max_tokens"]
                        for r, q in zip(results, trace)),
        "prompt_tokens": [r["usage"].get("prompt_tokens") for r in results],
        "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95),
        "itl_p50_ms": 1e3 * pct(itl, 50), "itl_p95_ms": 1e3 * pct(itl, 95),
        # The longest wait between two tokens of one stream (a prefill joining the batch).
        "itl_max_ms": 1e3 * max(itl, default=0.0),
        "connection_retries": sum(r.get("retries", 0) for r in results),
    }



def make_fixed_trace(tokenizer, n, args, streams):
    """``n`` requests of the fixed workload (lengths from ``--prompt-len``/``--output-len``,
    equal bounds under ``--fixed-len``), as ``run`` prepares the arrival trace; seeded per
    level so every server gets the same prompts at a level."""
    trace = make_trace(tokenizer, n, 1.0, args.prompt_len, args.output_len, args.seed + streams)
    for r in trace:
        r["text"] = tokenizer.decode(r.pop("prompt"))
        r["ids"] = tokenizer.encode(r["text"])
    return trace


def compare_texts(results, texts):
    """Each server's share of greedy texts equal to mlx-lm's (or the first server's)."""
    reference = texts.get("mlx-lm") or next(iter(texts.values()))
    for name, t in texts.items():
        # mlx-lm's streaming detokenizer drops the first token's leading space: compare
        # the texts without leading whitespace.
        same = sum(a.lstrip() == b.lstrip() for a, b in zip(t, reference))
        results[name]["equal_to_mlx_lm"] = same / len(reference)

def run(args):
    from transformers import AutoTokenizer

    from mlx_lm_batched import _blas

    tokenizer = AutoTokenizer.from_pretrained(os.fspath(args.model))
    trace = make_trace(tokenizer, args.requests, args.rate, args.prompt_len, args.output_len,
                       args.seed)
    for r in trace:  # the tokens mlx_lm.server will see for the text (see the docstring)
        r["text"] = tokenizer.decode(r.pop("prompt"))
        r["ids"] = tokenizer.encode(r["text"])
    bias = {str(i): -100 for i in eos_ids(args.model, tokenizer)}
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = set(servers) - set(SERVERS)
    if unknown or not servers:
        raise SystemExit(f"error: --servers {args.servers!r}: choose from {sorted(SERVERS)}")
    levels = args.concurrency or [None]  # None: the arrival trace, replayed once
    traces = {c: trace if c is None else
              make_fixed_trace(tokenizer, c * args.requests_per_stream, args, c) for c in levels}
    results = {c: {} for c in levels}
    texts = {c: {} for c in levels}
    for name in servers:
        proc, url, log = start(name, args.model, args.batch_size, not args.mlx_lm_bundled_blas,
                               not args.mlx_lm_system_malloc, shlex.split(args.ours_args))
        try:
            for c in levels:
                job = (replay(name, url, args.model, traces[c], bias) if c is None else
                       closed_loop(name, url, args.model, traces[c], bias, c))
                out = asyncio.run(job)
                results[c][name] = summarize(traces[c], out)
                texts[c][name] = [r["text"] for r in out]
        finally:
            stop(proc)
        os.unlink(log)
    for c in levels:
        compare_texts(results[c], texts[c])
    if args.concurrency:
        return {
            "model": str(args.model), "machine": machine(), "blas": _blas.describe(),
            "attention": attention(), "ours_args": args.ours_args,
            "mode": "concurrency", "seed": args.seed, "batch_size": args.batch_size,
            "prompt_len": list(args.prompt_len), "output_len": list(args.output_len),
            "requests_per_stream": args.requests_per_stream,
            "mlx_lm_blas": "bundled" if args.mlx_lm_bundled_blas else "same as ours",
            "mlx_lm_malloc": "glibc defaults" if args.mlx_lm_system_malloc else "same as ours",
            "eos_banned": sorted(int(i) for i in bias),
            "levels": [{"concurrency": c, "requests": len(traces[c]), "results": results[c],
                        "texts": texts[c]} for c in levels],
        }
    results, texts = results[None], texts[None]
    return {
        "model": str(args.model), "machine": machine(), "blas": _blas.describe(),
        "attention": attention(), "ours_args": args.ours_args,
        "requests": args.requests, "rate": args.rate, "seed": args.seed,
        "prompt_len": list(args.prompt_len), "output_len": list(args.output_len),
        "batch_size": args.batch_size,
        "mlx_lm_blas": "bundled" if args.mlx_lm_bundled_blas else "same as ours",
        "mlx_lm_malloc": "glibc defaults" if args.mlx_lm_system_malloc else "same as ours",
        "eos_banned": sorted(int(i) for i in bias),
        "results": results, "texts": texts,
    }


def print_table(out, file=sys.stdout):
    print(f"model {out['model']} ({out['machine']}; BLAS: {out['blas']}; "
          f"{out.get('attention', 'CPU primitives not recorded')}; mlx-lm's BLAS: "
          f"{out['mlx_lm_blas']}; mlx-lm's malloc: {out.get('mlx_lm_malloc', 'same as ours')}"
          f"{'; our flags: ' + out['ours_args'] if out.get('ours_args') else ''})", file=file)
    lengths = (f"prompts {out['prompt_len'][0]}-{out['prompt_len'][1]} tokens, outputs "
               f"{out['output_len'][0]}-{out['output_len'][1]}, seed {out['seed']}, decode batch "
               f"{out['batch_size']}")
    if out.get("mode") == "concurrency":
        print(f"closed loop over HTTP, {out['requests_per_stream']} requests per stream, "
              f"{lengths}", file=file)
        levels = [(level["concurrency"], level["results"]) for level in out["levels"]]
    else:
        print(f"{out['requests']} requests over HTTP, Poisson {out['rate']}/s, {lengths}", file=file)
        levels = [(None, out["results"])]
    print(f"{'streams':>7} {'server':8} {'req/s':>6} {'out t/s':>8} {'TTFT p50':>9} {'TTFT p95':>9} "
          f"{'ITL p50':>8} {'ITL p95':>8} {'ITL max':>8} {'x mlx-lm':>8} {'=mlx-lm':>8} {'tokens':>11}", file=file)
    for streams, results in levels:
        base = results.get("mlx-lm", {}).get("output_tps")
        for name, r in results.items():
            ratio = f"{r['output_tps'] / base:8.2f}" if base else f"{'':8}"
            # Runs recorded before the column existed have no maximum.
            itl_max = f"{r['itl_max_ms']:6.0f}ms" if "itl_max_ms" in r else f"{'-':>8}"
            print(f"{streams or '-':>7} {name:8} {r['requests_per_s']:6.2f} {r['output_tps']:8.1f} "
                  f"{r['ttft_p50_s']:8.2f}s {r['ttft_p95_s']:8.2f}s {r['itl_p50_ms']:6.0f}ms "
                  f"{r['itl_p95_ms']:6.0f}ms {itl_max} {ratio} {100 * r['equal_to_mlx_lm']:7.0f}% "
                  f"{r['generated']:>5}/{r['expected']:<5}", file=file)
    retried = [f"{name} {r['connection_retries']} at {streams or 'the trace'}"
               for streams, results in levels for name, r in results.items()
               if r.get("connection_retries")]
    if retried:
        print("requests sent again after a connection reset before any response: "
              + ", ".join(retried), file=file)


def plot(out, path):
    """Two panels: output tokens/s per server; TTFT p50/p95 per server."""
    plot_trace(out, path, what="throughput over HTTP", who="servers: ")


def main(argv=None):
    p = trace_parser(__doc__.splitlines()[0], "model directory both servers can load",
                     "rows decoding at once on both servers (--max-batch / --decode-concurrency)")
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--mlx-lm-bundled-blas", action="store_true",
                   help="run mlx_lm.server as shipped (default: with our BLAS preload, like ours)")
    p.add_argument("--mlx-lm-system-malloc", action="store_true",
                   help="run mlx_lm.server with glibc's malloc defaults (default: with the "
                        "thresholds `import mlx_lm_batched` sets, like ours)")
    p.add_argument("--ours-args", default="",
                   help="more flags for our server, as one string (e.g. "
                        "'--prefill-tokens-per-step 0' for whole prefill chunks)")
    p.add_argument("--fixed-len", type=int, nargs=2, default=None, metavar=("PROMPT", "OUTPUT"),
                   help="every prompt PROMPT tokens and every output OUTPUT tokens "
                        "(sets --prompt-len PROMPT PROMPT --output-len OUTPUT OUTPUT)")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, metavar="C",
                   help="closed-loop sweep: C concurrent streams per level, in place of the "
                        "arrival trace (--requests and --rate then do not apply)")
    p.add_argument("--requests-per-stream", type=int, default=4,
                   help="requests each stream sends per --concurrency level")
    args = p.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        p.error(f"--model {args.model!r}: not a model directory (no config.json)")
    if args.fixed_len:
        args.prompt_len = [args.fixed_len[0]] * 2
        args.output_len = [args.fixed_len[1]] * 2
    check_trace_args(p, args)
    if args.concurrency and (min(args.concurrency) < 1 or args.requests_per_stream < 1):
        p.error("--concurrency levels and --requests-per-stream must be positive")
    if args.concurrency and args.plot:
        p.error("--plot draws the arrival-trace replay; it has no form for --concurrency")
    report(run(args), args, print_table, plot)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
