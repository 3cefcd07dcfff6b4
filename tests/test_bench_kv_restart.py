"""scripts/bench_kv_restart.py runs end to end with a short prefix on the real SmolLM2
float32 model: after SIGKILL, a server restarted on the same ``--kv-disk-dir`` takes the
prefix from disk (``cached_tokens``) and answers as the cold server did, and a second server
process on the directory reads it too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_kv_restart.py"


@pytest.mark.slow
def test_prefix_served_from_disk_after_kill_and_to_a_second_process(tmp_path):
    out = tmp_path / "restart.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(model_dir("smollm2", dtype="float32")),
         "--system-tokens", "160", "--max-tokens", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
        env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    cold, restart, second = r["cold"], r["restart"], r["second_process"]
    assert cold["cached_tokens"] == 0 and cold["disk"]["blocks_on_disk"] >= 5
    # Whole 32-token blocks of the prompt, from disk: nothing was in memory after the restart.
    assert restart["prompt_tokens"] == cold["prompt_tokens"] > 160
    assert restart["cached_tokens"] >= 160 and restart["cached_tokens"] % 32 == 0
    assert restart["cached_tokens"] < restart["prompt_tokens"]
    assert r["restart_answer_equal_cold"] and restart["answer"].strip()
    assert second["cached_tokens"] >= 160 and second["answer"].strip()
    assert r["restart_ttft_over_cold"] == round(restart["ttft_s"] / cold["ttft_s"], 3)
