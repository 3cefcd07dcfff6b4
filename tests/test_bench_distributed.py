"""scripts/bench_distributed.py runs end to end with tiny sizes: one process, 2 ranks
tensor parallel and 2 ranks pipeline parallel on the real SmolLM2 float32 model; every mode
gives the single process's tokens and the bytes measured on the sockets are the ones the
collectives must move (computed from the model's sizes)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_distributed.py"
# A benchmark script end to end on the real model: left out of the quick run
# (-m "not slow").
pytestmark = pytest.mark.slow


def test_bench_distributed_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--model", str(model_dir("smollm2", dtype="float32")),
                           "--batch-sizes", "2", "--max-tokens", "3", "--prompt-len", "4",
                           "--modes", "single,tensor,pipeline", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "computed traffic per decode step" in proc.stdout and "Llama-3-70B" in proc.stdout
    result = json.loads(out.read_text())
    assert "cores" in result["machine"]
    runs = result["runs"]
    assert sorted(runs) == ["pipeline", "single", "tensor"]
    assert runs["single"][0]["bytes_per_step"] == 0
    for mode in ("tensor", "pipeline"):
        row = runs[mode][0]
        assert row["batch_size"] == 2 and row["step_ms"] > 0
        assert row["same_tokens_as_single"] == 1.0
        # TCP payload within 2% of the collectives' bytes (SmolLM2 float32: tensor 60
        # all-reduces of (2, 576); pipeline one hop of (2, 576) and the (2, 49152) logits).
        expected = {"tensor": 552960, "pipeline": 791040}[mode]
        assert row["computed_bytes"] == expected
        assert abs(row["bytes_per_step"] - expected) < 0.02 * expected, row
    big = {(v["model"], v["batch_size"]): v for v in result["computed"]}[("Llama-3-70B", 2)]
    assert big["tensor_bytes"] == 2 * 80 * 2 * 2 * 8192 * 2  # bf16, 2 ranks
    assert big["pipeline_bytes"] < big["tensor_bytes"]
