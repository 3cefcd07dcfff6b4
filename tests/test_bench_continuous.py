"""scripts/bench_continuous.py replays an arrival trace through every system on the real model.

A tiny trace keeps it quick; the point is that the three systems run the same requests, the
metrics are computed, and continuous batching (ours and mlx-lm's) reproduces the static
batches' greedy tokens for every request.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench_continuous.py"
# A benchmark script end to end on the real model: left out of the quick run
# (-m "not slow").
pytestmark = pytest.mark.slow


def test_trace_replayed_through_every_system(float_dirs, tmp_path):
    out, png = tmp_path / "cont.json", tmp_path / "cont.png"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(float_dirs["smollm2"]), "--requests", "6",
         "--rate", "4", "--prompt-len", "8", "80", "--output-len", "3", "10",
         "--json", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TTFT p95" in proc.stdout and "x mlx-lm" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"ours", "mlx-lm", "static"}
    for name, r in result["results"].items():
        assert 6 * 3 <= r["generated"] <= 6 * 10, name
        assert r["equal_to_static"] == 1.0, name  # same greedy tokens for every request
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"], name
        assert r["output_tps"] > 0 and r["itl_p50_ms"] > 0, name
    generated = {r["generated"] for r in result["results"].values()}
    assert len(generated) == 1  # every system did the same work
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
