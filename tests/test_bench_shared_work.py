"""scripts/bench_shared_work.py runs end to end with tiny sizes on the Q4_1 GGUF: the three
ways (helpers that join as they wake, OpenMP, one thread) alternated, each with a rate,
and the same tokens from all three."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env
from mlx_lm_batched.loading.demo_models import smollm2_gguf_path
from test_cpu_prims import kernel, pytestmark  # noqa: F401  (skips where it is not built)

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_shared_work.py"


@pytest.mark.slow
def test_bench_shared_work_table_and_json(kernel, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--model", smollm2_gguf_path(),
                           "--batch-sizes", "1,3", "--prompt-tokens", "24", "--tokens", "6",
                           "--repeats", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shared/openmp" in proc.stdout and "load average at end" in proc.stdout
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["results"]] == [1, 3]
    for r in result["results"]:
        assert r["same_tokens"] is True
        assert set(r["tok_per_s"]) == {"openmp", "shared", "one thread"}
        assert all(len(v) == 2 and min(v) > 0 for v in r["tok_per_s"].values()), r
        assert len(r["shared_over_openmp"]) == 2
