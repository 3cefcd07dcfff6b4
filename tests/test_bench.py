"""scripts/bench.py runs as the README says: table, JSON and plot, on the real model.

Small settings keep it quick; the point is that every side runs, the ratios are
computed, and our batched rows reproduce sequential generation token for token.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import with_torch

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench.py"
# A benchmark script end to end on the real model: left out of the quick run
# (-m "not slow").
pytestmark = pytest.mark.slow


def run_bench(*args, env=None, torch=False):
    env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=900, env=with_torch(env) if torch else env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_bench_table_json_and_plot(float_dirs, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = run_bench("--model", str(float_dirs["smollm2"]), "--prompts", "4", "--max-tokens", "6",
                     "--batch-sizes", "1,4", "--repeats", "1", "--max-prompt-len", "48",
                     "--json", str(out), "--plot", str(png))
    table = proc.stdout
    assert "gen/seq" in table and "gen/mlx" in table
    configs = [line.split()[:2] for line in table.splitlines()
               if line.split()[:1] in (["seq"], ["ours"], ["mlx-lm"])]
    assert configs == [["seq", "1"], ["ours", "1"], ["mlx-lm", "1"], ["ours", "4"], ["mlx-lm", "4"]]

    result = json.loads(out.read_text())
    assert len(result["prompt_lengths"]) == 4
    assert all(16 <= n <= 48 for n in result["prompt_lengths"])
    rows = {(m["config"], m["batch_size"]): m for m in result["rows"]}
    for key in (("ours", 1), ("ours", 4)):
        m = rows[key]
        assert m["generated"] == 4 * 6  # EOS ignored: every row does the same work
        assert m["same_tokens_as_seq"] == 1.0  # batched rows equal sequential generation
        assert m["gen_vs_mlx_lm"] > 0 and m["gen_vs_seq"] > 0
        assert m["peak_gb"] >= result["weights_gb"]
        assert 0 <= m["padding_share"] < 1
    assert rows[("mlx-lm", 4)]["generated"] == 4 * 6
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_compares_blas_in_separate_processes(float_dirs, tmp_path):
    from mlx_lm_batched import _blas

    out = tmp_path / "blas.json"
    proc = run_bench("--model", str(float_dirs["smollm2"]), "--prompts", "2", "--max-tokens", "3",
                     "--batch-sizes", "2", "--repeats", "1", "--max-prompt-len", "24",
                     "--no-mlx-lm", "--compare-blas", "--json", str(out))
    assert "BLAS comparison" in proc.stdout
    results = json.loads(out.read_text())
    # Every BLAS found here ran (CI has MKL from the dependency and OpenBLAS from apt).
    found = {"MKL": _blas.find_mkl(), "OpenBLAS": _blas.find_openblas()}
    expected = {"bundled BLAS"} | {label for label, path in found.items() if path}
    assert set(results) == expected and len(expected) >= 2
    assert results["bundled BLAS"]["blas"] == "bundled (reference)"
    for label in expected - {"bundled BLAS"}:
        assert results[label]["blas_kind"] == label.lower()
        assert results[label]["blas"].startswith(label.lower() + " ")
    # The header names the CPU and the BLAS of each run.
    assert proc.stdout.count("; BLAS: ") == len(expected)
    assert all(r["rows"][0]["generated"] == 2 * 3 for r in results.values())


def test_bench_hybrid_random_checkpoint(float_dirs, tmp_path):
    # A random Qwen3-Next (hidden 512, 8 layers) with SmolLM2's tokenizer and vocabulary,
    # built with transformers once, then loaded by both libraries.
    out = tmp_path / "hybrid.json"
    proc = run_bench("--model", str(float_dirs["smollm2"]), "--hybrid", "qwen3_next",
                     "--prompts", "3", "--max-tokens", "4", "--batch-sizes", "1,3",
                     "--repeats", "1", "--max-prompt-len", "40", "--json", str(out), torch=True)
    assert "load average" in proc.stdout and "rows equal to the same side's batch-1" in proc.stdout
    result = json.loads(out.read_text())
    config = json.loads((Path(result["model"]) / "config.json").read_text())
    assert config["model_type"] == "qwen3_next" and config["hidden_size"] == 512
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 8
    assert "linear_attention" in config["layer_types"] and "full_attention" in config["layer_types"]
    assert result["hybrid"] == "qwen3_next" and len(result["load_avg_start"]) == 3
    rows = {(m["config"], m["batch_size"]): m for m in result["rows"]}
    assert set(rows) == {("seq", 1), ("ours", 1), ("ours", 3), ("mlx-lm", 1), ("mlx-lm", 3)}
    for key in (("ours", 1), ("ours", 3)):
        assert rows[key]["generated"] == 3 * 4
        assert rows[key]["same_tokens_as_seq"] == 1.0  # padded rows equal solo generation
    assert rows[("ours", 3)]["same_tokens_as_own_bs1"] == 1.0
    assert 0 <= rows[("mlx-lm", 3)]["same_tokens_as_own_bs1"] <= 1
    # Ideal memory counts each row's recurrent state (6 linear-attention layers of
    # 8 heads x 64 x 64 float32 state and 3 x 1024 conv inputs) and its key/value
    # slots (2 attention layers, 2 KV heads of 64, keys and values).
    state = 3 * 6 * (8 * 64 * 64 + 3 * 1024) * 4
    slots = sum(n + 4 for n in result["prompt_lengths"])
    assert result["ideal_kv_gb"] * 1e9 == pytest.approx(state + slots * 2 * 2 * 2 * 64 * 4)
