"""``python -m mlx_lm_batched.benchmark`` as a user runs it (mlx-lm's flags, several -b)."""

import os
import re
import subprocess
import sys

from conftest import model_dir


def test_benchmark_reports_each_batch_size():
    smol = model_dir("smollm2", dtype="float32")
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.benchmark", "--model", str(smol),
                           "-p", "8", "-g", "3", "-b", "1", "2", "-n", "1"],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert [int(b) for b in re.findall(r"batch_size=(\d+)\.", out)] == [1, 2]
    trials = re.findall(r"Trial 1:  prompt_tps=([\d.]+), generation_tps=([\d.]+), "
                        r"peak_memory=([\d.]+), total_time=([\d.]+)", out)
    assert len(trials) == 2 and all(float(v) > 0 for t in trials for v in t), out
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [int(r[0]) for r in rows] == [1, 2]


def test_benchmark_bad_flag_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.benchmark", "-b", "2", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --batch-size must be at least 1, got 0"
