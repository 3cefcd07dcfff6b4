"""scripts/bench_server.py replays an arrival trace over HTTP to both servers on the real model.

A tiny trace keeps it quick; the point is that both servers (real subprocesses on
127.0.0.1) get the same prompts, produce every requested token (EOS banned), agree on the
greedy outputs, and that the table, JSON and plot are written.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench_server.py"


def test_trace_replayed_over_http_to_both_servers(float_dirs, tmp_path):
    out, png = tmp_path / "srv.json", tmp_path / "srv.png"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(float_dirs["smollm2"]), "--requests", "6",
         "--rate", "4", "--prompt-len", "8", "80", "--output-len", "3", "10",
         "--json", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TTFT p95" in proc.stdout and "x mlx-lm" in proc.stdout and "BLAS" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"ours", "mlx-lm"}
    ours, theirs = result["results"]["ours"], result["results"]["mlx-lm"]
    for name, r in result["results"].items():
        assert 6 * 3 <= r["expected"] <= 6 * 10, name
        assert r["generated"] == r["expected"] and r["complete"] == 6, name  # no early stop
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"], name
        assert r["output_tps"] > 0 and r["requests_per_s"] > 0 and r["itl_p50_ms"] > 0, name
        assert r["equal_to_mlx_lm"] == 1.0, name  # the same greedy text for every request
    assert ours["prompt_tokens"] == theirs["prompt_tokens"]  # identical prompts on both sides
    assert all(t.strip() for t in result["texts"]["ours"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fixed_workload_concurrency_sweep(float_dirs, tmp_path):
    """``--fixed-len P O --concurrency ...``: closed-loop streams per level, every prompt
    exactly P tokens and every output exactly O (ours only: the trace test above already
    runs mlx_lm.server)."""
    out = tmp_path / "sweep.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(float_dirs["smollm2"]), "--servers", "ours",
         "--fixed-len", "12", "3", "--concurrency", "1", "3", "--requests-per-stream", "1",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "closed loop over HTTP" in proc.stdout and "streams" in proc.stdout
    result = json.loads(out.read_text())
    assert result["mode"] == "concurrency" and result["prompt_len"] == [12, 12]
    assert [level["concurrency"] for level in result["levels"]] == [1, 3]
    for level in result["levels"]:
        r = level["results"]["ours"]
        n = level["concurrency"]
        assert level["requests"] == n and r["prompt_tokens"] == [12] * n
        assert r["generated"] == r["expected"] == 3 * n and r["complete"] == n
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"] and r["output_tps"] > 0
