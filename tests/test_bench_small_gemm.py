"""scripts/bench_small_gemm.py runs end to end with tiny sizes on the real SmolLM2 float32
model: the kernel and the BLAS compute the same products, and a decode step runs with both
row limits. Where the kernel is not built (no compiler, no BLAS loaded) the script says so
and exits 1."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env
from mlx_lm_batched import _small_gemm

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_small_gemm.py"
# A benchmark script end to end on the real model: left out of the quick run
# (-m "not slow").
pytestmark = pytest.mark.slow


def test_bench_small_gemm_table_and_json(tmp_path):
    out = tmp_path / "small_gemm.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--model",
                           str(model_dir("smollm2", dtype="float32")), "--rows", "1,9",
                           "--batch-sizes", "2", "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    if not _small_gemm.max_rows:
        assert proc.returncode == 1 and "not in use" in proc.stdout, proc.stdout
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BLAS/kernel" in proc.stdout
    result = json.loads(out.read_text())
    assert "cores" in result["machine"] and "small-row kernel" in result["blas"]
    assert [r["rows"] for r in result["products"]] == [1, 9]
    for r in result["products"]:
        assert r["kernel_ms"] > 0 and r["blas_ms"] > 0
        assert r["max_relative_difference"] < 1e-5, r
    (step,) = result["steps"]
    assert step["batch"] == 2 and step["limit_8_ms"] > 0 and step["limit_batch_ms"] > 0
