"""scripts/bench_kv_bound.py runs end to end with tiny sizes on the real SmolLM2 float32
model: more distinct requests at once than the KV bound admits together, every one answered
200 (the rest wait, none refused), some seen waiting for KV memory, the server's memory
within the bound plus the margin, and the requests that started last equal to themselves
sent alone, token for token."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
BENCH = SCRIPTS / "bench_kv_bound.py"


def sampled(env, samples):
    """``env`` with the server sampling its own memory into ``samples``
    (``scripts/memory_sampler``, first on ``PYTHONPATH``)."""
    return dict(env, MEMORY_SAMPLER_DIR=str(samples), MEMORY_SAMPLER_STACKS_ABOVE="0",
                PYTHONPATH=os.pathsep.join([str(SCRIPTS / "memory_sampler"), env["PYTHONPATH"]]))


@pytest.mark.slow
def test_requests_beyond_the_bound_wait_and_all_answer(tmp_path):
    out, samples = tmp_path / "bound.json", tmp_path / "memory"
    # 5 requests of 96 prompt + 4 new tokens: 100 slots x 46,080 bytes = 4.6 MB each; of
    # --kv-memory 0.016 (GB) the prefix cache's blocks get a quarter and requests 12 MB,
    # which admit 2 at a time: 3 must wait.
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(model_dir("smollm2", dtype="float32")),
         "--requests", "5", "--prompt-tokens", "96", "--max-tokens", "4",
         "--kv-memory", "0.016", "--check", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
        env=sampled(subprocess_env(), samples))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["statuses"] == {"200": 5} and r["all_200"] and r["errors"] == []
    assert r["kv_budget_bytes"] == 12e6 and r["prefix_cache_bound_bytes"] == 4e6
    assert r["metrics_peaks"]["kv_waiting_requests"] >= 1  # the bound did hold requests back
    assert 0 < r["metrics_peaks"]["kv_reserved_bytes"] <= r["kv_budget_bytes"]
    assert r["generated_tokens"] == 5 * 4
    assert [x["completion_tokens"] for x in r["records"]] == [4] * 5
    assert r["checked_alone"] == r["equal_alone"] == 2 and r["mismatches"] == []
    assert 0 < r["peak_rss_above_warm_bytes"] and r["memory_within_target"]
    assert r["target_bytes"] == 316_000_000 and r["warm_active_bytes"] > 0
    assert r["cpu"] and r["blas"] and len(r["load_average"]) == 3
    # What the server held when its RSS was largest: the arrays and MLX's cache, within
    # its resident size, which /metrics reports as the benchmark reads it.
    at_peak = r["metrics_at_peak_rss"]
    assert 0 < at_peak["memory_active_bytes"] + at_peak["memory_cache_bytes"] < at_peak["rss_bytes"]
    assert 0.5 < at_peak["memory_resident_bytes"] / at_peak["rss_bytes"] < 2

    # The sampler ran in the server alone (one timeline), from before the model loaded
    # to its end; the summary finds MLX's arrays (the weights at least) inside the
    # resident size, and the engine's stacks were written while arrays were held.
    timelines = list(samples.glob("timeline-*.txt"))
    assert len(timelines) == 1
    summary = subprocess.run(
        [sys.executable, str(SCRIPTS / "memory_timeline.py"), str(samples), "--json",
         str(tmp_path / "timeline.json")], capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    result, = json.loads((tmp_path / "timeline.json").read_text()).values()
    assert result["samples"] > 50
    peak = result["max_mlx_active"]
    assert 0.5 < peak["mlx_active"] < peak["resident"]  # 0.54 GB of float32 weights
    assert result["max_resident"]["resident"] >= peak["resident"]
    stacks = (samples / "stacks.txt").read_text()
    assert "mlx_lm_batched/server/engine.py" in stacks
    # Under its KV bound the server keeps a resident ceiling (a thread of _malloc's).
    assert "mlx_lm_batched/_malloc.py" in stacks and "in _run" in stacks
