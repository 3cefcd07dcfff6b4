"""scripts/bench_cpu_prims.py runs end to end with tiny sizes on the real SmolLM2 float32
model: a decode step with our CPU primitives and with MLX's ops, their graph sizes, and
attention alone both ways."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_cpu_prims.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the primitives build on Linux")
def test_bench_cpu_prims_table_and_json(tmp_path):
    out = tmp_path / "prims.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--model",
                           str(model_dir("smollm2", dtype="float32")), "--batch-sizes", "2",
                           "--prompt-len", "16", "--steps", "2", "--repeats", "1",
                           "--attention", "2x40", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "CPU primitives (attention, RMSNorm, RoPE, linear, SwiGLU, quantized linear)" in result["blas"]
    (step,) = result["forward"]
    assert step["bs"] == 2 and step["prims_ms"] > 0 and step["ops_ms"] > 0
    # 30 layers: each RMSNorm (~8 nodes), RoPE (~20) and attention (~30) becomes one.
    assert step["ops_nodes"] - step["nodes"] > 30 * 40, step
    (attention,) = result["attention"]
    assert attention["rows"] == 2 and attention["slots"] == 40
    assert attention["prims_ms"] > 0 and attention["ops_ms"] > 0
