"""scripts/bench_prefill_stall.py runs end to end with tiny sizes on the real SmolLM2 float32
model: a burst of prompts joins decoding rows under no prefill budget and under a small one;
the budget spreads the burst over more steps, each feeding at most its tokens, and every
row's greedy tokens stay the same."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_prefill_stall.py"


def run_bench(*args):
    return subprocess.run([sys.executable, str(BENCH), "--model",
                           str(model_dir("smollm2", dtype="float32")), *args],
                          capture_output=True, text=True, timeout=600,
                          env=subprocess_env())


@pytest.mark.slow
def test_budget_spreads_the_burst_over_steps_with_the_same_tokens(tmp_path):
    out = tmp_path / "stall.json"
    # 2 prompts of 40 tokens join 2 decoding rows: without a budget the burst is one
    # chunk (39 columns) and the last column; with 16 tokens per step, 8 columns per call.
    # While rows decode, a prompt's own last-column split does not end the step: the
    # last column runs in the step of the chunk before it when the budget has room.
    proc = run_bench("--decoding", "2", "--decoding-len", "16", "--joining", "2",
                     "--joining-len", "40", "--budgets", "0,16", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step max" in proc.stdout and "cores" in proc.stdout
    result = json.loads(out.read_text())
    assert result["decoding"] == [2, 16] and result["joining"] == [2, 40]
    unbounded, bounded = result["results"]
    assert (unbounded["budget"], bounded["budget"]) == (0, 16)
    assert unbounded["steps"] == 2  # the chunk and the last column, the first token
    # ceil(39 / 8) calls, one a step: the fifth (7 columns, 14 tokens) leaves room for the
    # last column's 2 tokens; then the first token.
    assert bounded["steps"] == 5 + 1
    assert unbounded["equal_to_first"] and bounded["equal_to_first"]
    for r in result["results"]:
        assert 0 < r["step_p50_ms"] <= r["step_max_ms"] and r["ttft_s"] > 0


def test_bad_budgets_are_one_line_errors():
    proc = run_bench("--budgets", "0,x")
    assert proc.returncode == 2 and "--budgets: expected comma-separated integers" in proc.stderr
    proc = run_bench("--budgets", "-5")
    assert proc.returncode == 2 and "--budgets must be >= 0" in proc.stderr
