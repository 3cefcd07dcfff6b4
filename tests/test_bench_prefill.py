"""scripts/bench_prefill.py runs end to end with tiny sizes on the real SmolLM2 float32
model: ours, ours without causal key trimming and mlx-lm prefill the same prompts and
sample the same first tokens."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_prefill.py"
# A benchmark script end to end on the real model: left out of the quick run
# (-m "not slow").
pytestmark = pytest.mark.slow


def test_bench_prefill_table_and_json(tmp_path):
    out = tmp_path / "prefill.json"
    # 2 rows of 150 tokens: three query blocks of 64 under the causal mask.
    proc = subprocess.run([sys.executable, str(BENCH), "--model",
                           str(model_dir("smollm2", dtype="float32")), "--shapes", "2x150",
                           "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ours/untrimmed" in proc.stdout
    result = json.loads(out.read_text())
    assert "cores" in result["machine"] and result["repeats"] == 1
    (row,) = result["rows"]
    assert (row["batch"], row["length"]) == (2, 150)
    assert row["same_first_tokens"] is True
    assert all(row[k] > 0 for k in ("ours_tps", "untrimmed_tps", "mlx_tps"))
