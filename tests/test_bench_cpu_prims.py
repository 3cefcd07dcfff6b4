"""scripts/bench_cpu_prims.py runs end to end with tiny sizes on the real SmolLM2 float32
model: a decode step with our CPU primitives and with MLX's ops, their graph sizes, and
attention alone both ways."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_cpu_prims.py"
# A benchmark script end to end on the real model: left out of the quick run
# (-m "not slow").
pytestmark = pytest.mark.slow


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the primitives build on Linux")
def test_bench_cpu_prims_table_and_json(tmp_path):
    out = tmp_path / "prims.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--model",
                           str(model_dir("smollm2", dtype="float32")), "--batch-sizes", "2",
                           "--prompt-len", "16", "--steps", "2", "--repeats", "1",
                           "--attention", "2x40", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "CPU primitives (attention, RMSNorm, RoPE, linear, SwiGLU, quantized linear)" in result["blas"]
    assert "cores" in result["machine"]
    assert len(result["load_start"]) == 3 and len(result["load_end"]) == 3
    (step,) = result["forward"]
    assert step["bs"] == 2
    # A decode step reads SmolLM2's 0.54 GB of float32 weights: at least a millisecond on
    # any memory system, and far under a minute (a unit slip, seconds for milliseconds,
    # lands outside).
    for key in ("prims_ms", "ops_ms"):
        assert 1 < step[key] < 60_000, step
    # 30 layers: each RMSNorm (~8 nodes), RoPE (~20) and attention (~30) becomes one.
    assert step["nodes"] >= 30 and step["ops_nodes"] - step["nodes"] > 30 * 40, step
    (attention,) = result["attention"]
    assert attention["rows"] == 2 and attention["slots"] == 40
    for key in ("prims_ms", "ops_ms"):
        assert 0 < attention[key] < 60_000, attention
    # The printed table is the JSON's numbers: the step row (ms, ratio, graph sizes)...
    row = re.search(r"^\s*2\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)$",
                    proc.stdout, re.M)
    assert row, proc.stdout
    prims, ops, ratio, nodes, ops_nodes = row.groups()
    assert float(prims) == pytest.approx(step["prims_ms"], abs=0.051)
    assert float(ops) == pytest.approx(step["ops_ms"], abs=0.051)
    assert float(ratio) == pytest.approx(step["ops_ms"] / step["prims_ms"], abs=0.0051)
    assert (int(nodes), int(ops_nodes)) == (step["nodes"], step["ops_nodes"])
    # ...and the attention row.
    row = re.search(r"^\s*2x40\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", proc.stdout, re.M)
    assert row, proc.stdout
    prims, ops, ratio = (float(v) for v in row.groups())
    assert prims == pytest.approx(attention["prims_ms"], abs=0.051)
    assert ops == pytest.approx(attention["ops_ms"], abs=0.051)
    assert ratio == pytest.approx(attention["ops_ms"] / attention["prims_ms"], abs=0.0051)
