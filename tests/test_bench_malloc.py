"""scripts/bench_malloc.py runs end to end with tiny sizes on the real SmolLM2 float32 model:
fresh processes with glibc's defaults and with our thresholds give the same tokens, and
ours fault in fewer pages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir
from mlx_lm_batched import _malloc

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_malloc.py"


@pytest.mark.skipif(not _malloc.supported(), reason="the thresholds are glibc's (Linux)")
def test_bench_malloc_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--model", str(model_dir("smollm2", dtype="float32")),
                           "--prompts", "4", "--max-tokens", "3", "--repeats", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "same tokens in every run: True" in proc.stdout
    result = json.loads(out.read_text())
    assert result["same_tokens"] is True and "cores" in result["machine"]
    runs = {}
    for r in result["runs"]:
        runs.setdefault(r["malloc"], []).append(r)
    assert sorted(runs) == ["auto", "system"] and all(len(v) == 2 for v in runs.values())
    assert all(r["wall_s"] > 0 and r["prompt_tokens"] > 4 * 16 - 1 for r in result["runs"])
    # Both load the same model and run the same batch; glibc's defaults fault the
    # forward pass's arrays in again on every layer. The margin is a few thousand faults
    # of about 25,000, so each setting's fewest over two alternated runs are compared
    # (one run each flipped once under a parallel test run's load).
    fewest = {name: min(r["faults"] for r in rs) for name, rs in runs.items()}
    assert fewest["auto"] < fewest["system"], result["runs"]
