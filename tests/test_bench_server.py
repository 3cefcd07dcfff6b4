"""scripts/bench_server.py replays an arrival trace over HTTP to both servers on the real model.

A tiny trace keeps it quick; the point is that both servers (real subprocesses on
127.0.0.1) get the same prompts, produce every requested token (EOS banned), agree on the
greedy outputs, and that the table, JSON and plot are written.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench_server.py"
GPU_SCRIPT, GPU_TABLE = ROOT / "scripts" / "bench_gpu.sh", ROOT / "scripts" / "bench_gpu_table.py"


@pytest.mark.slow
def test_trace_replayed_over_http_to_both_servers(float_dirs, tmp_path):
    out, png = tmp_path / "srv.json", tmp_path / "srv.png"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(float_dirs["smollm2"]), "--requests", "6",
         "--rate", "4", "--prompt-len", "8", "80", "--output-len", "3", "10",
         "--json", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TTFT p95" in proc.stdout and "x mlx-lm" in proc.stdout and "BLAS" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"ours", "mlx-lm"}
    ours, theirs = result["results"]["ours"], result["results"]["mlx-lm"]
    for name, r in result["results"].items():
        assert 6 * 3 <= r["expected"] <= 6 * 10, name
        assert r["generated"] == r["expected"] and r["complete"] == 6, name  # no early stop
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"], name
        assert r["output_tps"] > 0 and r["requests_per_s"] > 0 and r["itl_p50_ms"] > 0, name
        assert r["itl_p50_ms"] <= r["itl_p95_ms"] <= r["itl_max_ms"], name
        assert r["equal_to_mlx_lm"] == 1.0, name  # the same greedy text for every request
    assert ours["prompt_tokens"] == theirs["prompt_tokens"]  # identical prompts on both sides
    assert all(t.strip() for t in result["texts"]["ours"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_fixed_workload_concurrency_sweep(float_dirs, tmp_path):
    """``--fixed-len P O --concurrency ...``: closed-loop streams per level, every prompt
    exactly P tokens and every output exactly O (ours only: the trace test above already
    runs mlx_lm.server). ``--ours-args`` reaches our server: a bad value of the flag it
    passes stops the server, which the script reports."""
    out = tmp_path / "sweep.json"
    command = [sys.executable, str(BENCH), "--model", str(float_dirs["smollm2"]), "--servers",
               "ours", "--fixed-len", "12", "3", "--concurrency", "1", "3",
               "--requests-per-stream", "1", "--json", str(out)]
    proc = subprocess.run(command + ["--ours-args", "--prefill-tokens-per-step 4"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "closed loop over HTTP" in proc.stdout and "streams" in proc.stdout
    assert "our flags: --prefill-tokens-per-step 4" in proc.stdout
    result = json.loads(out.read_text())
    assert result["mode"] == "concurrency" and result["prompt_len"] == [12, 12]
    assert result["ours_args"] == "--prefill-tokens-per-step 4"
    assert [level["concurrency"] for level in result["levels"]] == [1, 3]
    for level in result["levels"]:
        r = level["results"]["ours"]
        n = level["concurrency"]
        assert level["requests"] == n and r["prompt_tokens"] == [12] * n
        assert r["generated"] == r["expected"] == 3 * n and r["complete"] == n
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"] and r["output_tps"] > 0
    # bench_gpu.sh's one table, from this JSON (no mlx-lm side here: its cells are "-").
    table = subprocess.run([sys.executable, str(GPU_TABLE), "--server", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    rows = {line[:34].strip(): line[34:].split() for line in table.stdout.splitlines()}
    for streams in ("1 stream", "3 streams"):
        ours, theirs, ratio = rows[f"server output tok/s, {streams}"]
        assert float(ours) > 0 and theirs == ratio == "-"
    bad = subprocess.run(command + ["--ours-args", "--prefill-tokens-per-step -1"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--prefill-tokens-per-step: must be >= 0" in bad.stderr


def test_gpu_script_parses_and_dry_run_prints_its_commands(float_dirs):
    """bench_gpu.sh cannot run here (no NVIDIA GPU): its syntax, its --dry-run plan and its
    refusal of a missing or bad --model are what a CPU machine can check."""
    assert subprocess.run(["bash", "-n", str(GPU_SCRIPT)]).returncode == 0
    model = str(float_dirs["smollm2"])
    plan = subprocess.run(["bash", str(GPU_SCRIPT), "--model", model, "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    assert all(line.startswith("+ ") for line in lines)
    pip = next(line for line in lines if "pip install" in line and "mlx" in line)
    assert "mlx\\[cuda\\]" in pip and "mlx-lm==0.32.2" in pip and "transformers" in pip
    assert "mlx\\[cpu\\]" not in pip and "mkl" not in pip  # no second MLX backend
    bench = next(line for line in lines if "scripts/bench.py" in line)
    assert model in bench and "--batch-sizes 1\\,4\\,16" in bench
    server = next(line for line in lines if "scripts/bench_server.py" in line)
    assert "--fixed-len 256 64 --concurrency 1 4 16" in server
    assert "bench_gpu_table.py" in lines[-1]
    for args, message in (([], "--model DIR is required"),
                          (["--model", str(ROOT)], "not a model directory")):
        bad = subprocess.run(["bash", str(GPU_SCRIPT), *args, "--dry-run"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and message in bad.stderr and not bad.stdout


@pytest.mark.slow
def test_profile_serving_reports_the_closed_loop_and_step_kinds(float_dirs):
    """scripts/profile_serving.py drives the fixed workload through BatchGenerator: every
    request gets all its tokens, and the step kinds add up."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_serving.py"), "--model",
         str(float_dirs["smollm2"]), "--fixed-len", "12", "5", "--concurrency", "3",
         "--requests-per-stream", "2", "--prefill-batch", "2"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "(6 requests, 30 tokens," in out, out
    assert "TTFT p50" in out and "inter-token p50" in out
    assert "decode + prefill call" in out and "decode only" in out
