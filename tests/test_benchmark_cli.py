"""``python -m mlx_lm_batched.benchmark`` as a user runs it (mlx-lm's flags, several -b)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import model_dir


@pytest.mark.slow
def test_benchmark_reports_each_batch_size():
    smol = model_dir("smollm2", dtype="float32")
    prompt_tokens, generation_tokens, batch_sizes = 8, 3, [1, 2]
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.benchmark", "--model", str(smol),
                           "-p", str(prompt_tokens), "-g", str(generation_tokens),
                           "-b", *map(str, batch_sizes), "-n", "1"],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    timing = re.findall(r"^Timing with prompt_tokens=(\d+), generation_tokens=(\d+), "
                        r"batch_size=(\d+)\.$", out, re.M)
    assert timing == [(str(prompt_tokens), str(generation_tokens), str(b)) for b in batch_sizes]
    trials = [[float(v) for v in t] for t in re.findall(
        r"^Trial 1:  prompt_tps=([\d.]+), generation_tps=([\d.]+), peak_memory=([\d.]+), "
        r"total_time=([\d.]+)$", out, re.M)]
    averages = [[float(v) for v in t] for t in re.findall(
        r"^Averages: prompt_tps=([\d.]+), generation_tps=([\d.]+), peak_memory=([\d.]+)$",
        out, re.M)]
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert len(trials) == len(averages) == len(rows) == len(batch_sizes), out
    for b, (ptps, gtps, peak, total), average, row in zip(batch_sizes, trials, averages, rows):
        # The rates count every row's tokens: the time they imply for the prompt tokens and
        # the generated tokens asked for fits in the trial's measured time (rates of one
        # row, or of fewer tokens than asked, would not fit).
        assert b * prompt_tokens / ptps + b * generation_tokens / gtps <= total * 1.02 + 0.002, out
        # Peak memory (GB) holds at least the 0.54 GB of float32 weights.
        assert 0.5 < peak < 16, out
        # One trial: its average is itself, and the summary row repeats it.
        assert average == [ptps, gtps, peak], out
        assert int(row[0]) == b
        assert [float(v) for v in row[1:]] == pytest.approx([ptps, gtps, peak], abs=0.051), out


def test_benchmark_bad_flag_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.benchmark", "-b", "2", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --batch-size must be at least 1, got 0"
