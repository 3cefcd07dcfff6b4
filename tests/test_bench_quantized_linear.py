"""scripts/bench_quantized_linear.py runs end to end with tiny sizes: our quantized linear
primitive, the float32 layer on the dequantized weight and MLX's op are timed on both of the
primitive's paths (tiled kernel, dequantized prefill), cycling through copies of each weight,
and ours computes the float32 layer's products to float32 rounding."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_cpu_prims import kernel, pytestmark  # noqa: F401  (skips where it is not built)
from conftest import subprocess_env

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_quantized_linear.py"


@pytest.mark.slow
def test_bench_quantized_linear_table_and_json(kernel, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--shapes", "96x128,33x256",
                           "--rows", "1,9,70", "--calls", "2", "--repeats", "1",
                           "--copies", "3", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "f32/ours" in proc.stdout and "load average at end" in proc.stdout
    result = json.loads(out.read_text())
    assert "cores" in result["machine"] and result["bits"] == 4 and result["group"] == 64
    assert result["copies"] == 3
    cases = [(r["n"], r["k"], r["rows"]) for r in result["results"]]
    assert cases == [(n, k, rows) for n, k in ((96, 128), (33, 256)) for rows in (1, 9, 70)]
    for r in result["results"]:
        assert r["ours_ms"] > 0 and r["f32_ms"] > 0 and r["mlx_op_ms"] > 0, r
        assert r["ours_weight_gb_per_s"] > 0, r
        assert r["max_relative_difference"] < 1e-5, r
