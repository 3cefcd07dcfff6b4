#!/usr/bin/env python
"""Multi-turn shared-prefix serving measured by guidellm: our server against ``mlx_lm.server``.

    python scripts/bench_guidellm.py --model DIR --guidellm PATH/TO/guidellm
        [--concurrency 8 16] [--data "prompt_tokens=128,output_tokens=32,prefix_tokens=1024,
        prefix_count=2,turns=3"] [--max-requests N] [--max-seconds 900] [--seed 0]
        [--servers ours,mlx-lm] [--json OUT]

guidellm (https://github.com/vllm-project/guidellm, an HTTP load generator installed in its
own virtual environment: it is not a dependency of this package) is the client. Each server
(``python -m mlx_lm_batched.server``, then ``python -m mlx_lm.server``, started as
``bench_server.start`` starts them: same model directory, same BLAS, same decode width, on
127.0.0.1) gets one short warm-up request, then for each concurrency ``C`` one
``guidellm run`` with the ``concurrent`` profile at ``C`` streams over
``/v1/chat/completions``, streamed, on guidellm's ``synthetic_text`` data: ``prefix_count``
system prompts of ``prefix_tokens`` tokens shared across conversations of ``turns`` turns,
each turn a new user message of ``prompt_tokens`` tokens after the whole conversation so far,
answered with ``output_tokens`` tokens. The data's seed is ``--seed + C``, so both servers get
the same conversations at a level and no level reuses another's prefixes. A level ends after
``--max-requests`` requests (default: two conversations per stream, ``2 * C * turns``) or
``--max-seconds``, whichever comes first.

Greedy and equal lengths on both servers: guidellm sends ``max_completion_tokens`` and
``ignore_eos`` (vLLM's field; ours honours it, mlx-lm ignores it), and this script adds
``temperature: 0`` and a ``logit_bias`` of -100 on every EOS id to every request body, so
neither server stops early.

Reported per level and server, from guidellm's JSON: output tokens/s (guidellm's mean over
the level), time to first token and inter-token latency p50/p95, requests completed and
errored, the share of completed requests with exactly ``output_tokens`` tokens, and the
share of prompt tokens the server reported as cached (``usage.prompt_tokens_details``,
which both servers fill). For ours also the prompt-token counters of ``/metrics``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_server import eos_ids, start, stop
from bench_serving_harness import machine, metrics

SERVERS = ("ours", "mlx-lm")
DATA_KEYS = ("prompt_tokens", "output_tokens", "prefix_tokens", "prefix_count", "turns")
DEFAULT_DATA = "prompt_tokens=128,output_tokens=32,prefix_tokens=1024,prefix_count=2,turns=3"
# The model name each server answers to (bench_server.start serves ours under its directory).
MODEL_NAME = {"ours": None, "mlx-lm": "default_model"}


def parse_data(text):
    """``"key=int,..."`` as a dict over :data:`DATA_KEYS`; every key required, positive."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in DATA_KEYS or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--data item {item!r}: expected KEY=POSITIVE-INT with KEY one "
                             f"of {', '.join(DATA_KEYS)}")
        out[key] = int(value)
    missing = [k for k in DATA_KEYS if k not in out]
    if missing:
        raise ValueError(f"--data lacks {', '.join(missing)}")
    return out


def warm_up(url, model):
    """One short greedy chat request, so that the first measured request finds a warm server."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 2, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def scenario(url, model, tokenizer_dir, data, streams, seed, max_requests, max_seconds,
             bias, out_path):
    """The guidellm scenario (its ``-c`` file) of one level against one server."""
    return {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": model,
                    "request_format": "/v1/chat/completions",
                    "extras": {"body": {"temperature": 0, "logit_bias": bias}}},
        "profile": {"kind": "concurrent", "streams": [streams]},
        "tokenizer": {"kind": "huggingface_auto", "model": tokenizer_dir},
        "data": [{"kind": "synthetic_text", **data}],
        "constraints": [{"kind": "max_requests", "count": max_requests},
                        {"kind": "max_duration", "seconds": max_seconds}],
        "seed": {"kind": "static", "value": seed},
        "outputs": [{"kind": "json", "path": str(out_path)}],
    }}


def run_guidellm(exe, spec, workdir, timeout):
    """Run ``guidellm run -c`` on ``spec``; its JSON report. Offline: the tokenizer is the
    model directory, never the hub."""
    path = Path(workdir, "scenario.json")
    path.write_text(json.dumps(spec, indent=1))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # guidellm's venv, not this checkout
    done = subprocess.run([exe, "run", "-c", str(path), "--disable-console-interactive"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    out = Path(spec["spec"]["outputs"][0]["path"])
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"guidellm exited with {done.returncode}:\n{done.stdout[-3000:]}"
                         f"\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def _successful(metric, key):
    return metric["successful"]["percentiles"][key]


def summarize(report, output_tokens):
    """One level's figures from guidellm's JSON report (its single benchmark)."""
    bench = report["benchmarks"][0]
    m, reqs = bench["metrics"], bench["requests"]
    done = reqs["successful"]
    prompt = sum(r["prompt_tokens"] or 0 for r in done)
    cached = sum(r["cached_tokens"] or 0 for r in done)
    generated = sum(r["output_tokens"] or 0 for r in done)
    return {
        "duration_s": bench["duration"],
        "output_tps": m["output_tokens_per_second"]["successful"]["mean"],
        "output_tps_sum_over_duration": generated / bench["duration"],
        "ttft_p50_s": _successful(m["time_to_first_token_ms"], "p50") / 1e3,
        "ttft_p95_s": _successful(m["time_to_first_token_ms"], "p95") / 1e3,
        "itl_p50_ms": _successful(m["inter_token_latency_ms"], "p50"),
        "itl_p95_ms": _successful(m["inter_token_latency_ms"], "p95"),
        "completed": len(done), "errored": len(reqs["errored"]),
        "incomplete": len(reqs["incomplete"]),
        "errors": sorted({str(r.get("info", {}).get("error", ""))[:200] for r in reqs["errored"]}),
        "generated": generated,
        # Tokens streamed by requests still running when --max-seconds ended the level:
        # not in output_tps (guidellm's rate counts completed requests only).
        "incomplete_generated": sum(r.get("output_tokens") or 0 for r in reqs["incomplete"]),
        "full_length": sum(r["output_tokens"] == output_tokens for r in done),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "ttft_p50_s_by_turn": [t["time_to_first_token_ms"]["successful"]["percentiles"]["p50"] / 1e3
                               for t in m.get("turns") or []],
    }


def prefix_counters(url):
    """Our server's prompt and cached-prompt token counters (``/metrics``)."""
    port = int(url.rsplit(":", 1)[1])
    got = metrics(port)
    return {k: got.get(f"mlx_lm_batched_{k}", 0.0)
            for k in ("prompt_tokens_total", "prompt_cached_tokens_total", "preemptions_total")}


def bench_server(name, args, data, bias, workdir):
    """Every level against server ``name``: ``{streams: summary}``."""
    batch = max(args.concurrency)
    proc, url, log = start(name, args.model, batch)
    model = MODEL_NAME[name] or str(args.model)
    out = {}
    try:
        warm_up(url, model)
        for c in args.concurrency:
            before = prefix_counters(url) if name == "ours" else None
            requests = args.max_requests or 2 * c * data["turns"]
            path = Path(workdir, f"{name}-{c}.json")
            spec = scenario(url, model, str(args.model), data, c, args.seed + c, requests,
                            args.max_seconds, bias, path)
            started = time.monotonic()
            report = run_guidellm(args.guidellm, spec, workdir, args.max_seconds + 600)
            out[c] = {"max_requests": requests, "wall_s": time.monotonic() - started,
                      **summarize(report, data["output_tokens"])}
            if before is not None:
                after = prefix_counters(url)
                out[c]["server_counters"] = {k: after[k] - before[k] for k in after}
    finally:
        stop(proc)
        os.unlink(log)
    return out


def print_table(result, file=sys.stdout):
    """One row per level: both servers side by side."""
    mach = result["machine"]
    print(f"{mach['cpu']} ({mach['cores']} cores), {mach['blas']}; load average before "
          f"{result['load_before']}, after {result['load_after']}; data {result['data']}",
          file=file)
    head = (f"{'streams':>7} {'out tok/s ours / mlx-lm (x)':>28} {'TTFT p50/p95 s ours':>20} "
            f"{'mlx-lm':>12} {'ITL p50/p95 ms ours':>20} {'mlx-lm':>10} "
            f"{'done/err ours':>13} {'mlx-lm':>7} {'cached ours':>11} {'mlx-lm':>6}")
    print(head, file=file)
    for level in result["levels"]:
        r = level["results"]
        ours, ref = r.get("ours"), r.get("mlx-lm")
        tps = lambda s: f"{s['output_tps']:.1f}" if s else "-"  # noqa: E731
        ttft = lambda s: f"{s['ttft_p50_s']:.2f}/{s['ttft_p95_s']:.2f}" if s else "-"  # noqa: E731
        itl = lambda s: f"{s['itl_p50_ms']:.0f}/{s['itl_p95_ms']:.0f}" if s else "-"  # noqa: E731
        done = lambda s: f"{s['completed']}/{s['errored']}" if s else "-"  # noqa: E731
        ratio = f" ({ours['output_tps'] / ref['output_tps']:.2f}x)" if ours and ref else ""
        cached = lambda s: f"{100 * s['cached_share']:.0f}%" if s else "-"  # noqa: E731
        print(f"{level['streams']:>7} {tps(ours) + ' / ' + tps(ref) + ratio:>28} "
              f"{ttft(ours):>20} {ttft(ref):>12} {itl(ours):>20} {itl(ref):>10} "
              f"{done(ours):>13} {done(ref):>7} {cached(ours):>11} {cached(ref):>6}", file=file)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="model directory (with tokenizer)")
    p.add_argument("--guidellm", required=True, help="the guidellm executable")
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 16], metavar="C")
    p.add_argument("--data", default=DEFAULT_DATA, help=f"synthetic data (default {DEFAULT_DATA})")
    p.add_argument("--max-requests", type=int, default=None,
                   help="requests per level (default: 2 conversations per stream)")
    p.add_argument("--max-seconds", type=int, default=900, help="time bound of one level")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        p.error(f"--model {str(args.model)!r}: not a model directory (no config.json)")
    if not os.access(args.guidellm, os.X_OK):
        p.error(f"--guidellm {args.guidellm!r}: not an executable")
    try:
        data = parse_data(args.data)
    except ValueError as e:
        p.error(str(e))
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not servers or set(servers) - set(SERVERS):
        p.error(f"--servers {args.servers!r}: choose from {', '.join(SERVERS)}")
    if min(args.concurrency) < 1 or (args.max_requests or 1) < 1 or args.max_seconds < 1:
        p.error("--concurrency, --max-requests and --max-seconds must be positive")

    from transformers import AutoTokenizer

    bias = {str(i): -100 for i in eos_ids(args.model, AutoTokenizer.from_pretrained(args.model))}
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-guidellm-") as workdir:
        by_server = {name: bench_server(name, args, data, bias, workdir) for name in servers}
    result = {
        "model": str(args.model), "machine": machine(), "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()], "data": data, "seed": args.seed,
        "max_seconds": args.max_seconds, "eos_banned": sorted(int(i) for i in bias),
        "command": " ".join(sys.argv),
        "levels": [{"streams": c, "results": {n: by_server[n][c] for n in servers}}
                   for c in args.concurrency],
    }
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
