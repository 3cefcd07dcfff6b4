"""scripts/profile_decode.py runs end to end on the real SmolLM2 float32 model at a tiny
batch and splits a synced step's CPU time by thread: the Python thread always, MLX's CPU
stream thread and the small-row kernel's worker where the kernel is built (it records
which threads computed its products)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_dir, subprocess_env
from mlx_lm_batched import _small_gemm

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "profile_decode.py"
# A benchmark script end to end on the real model: left out of the quick run
# (-m "not slow").
pytestmark = pytest.mark.slow


def test_profile_decode_splits_cpu_time_by_thread():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model",
                           str(model_dir("smollm2", dtype="float32")), "--batch", "2",
                           "--steps", "2", "--repeats", "1"],
                          capture_output=True, text=True, timeout=600,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "decode step, batch 2" in out and "projections (all layers' matmuls)" in out
    header = re.search(r"CPU time per synced step by thread \(step ([\d.]+) ms wall", out)
    assert header and float(header.group(1)) > 0, out
    by_thread = {m.group(1).strip(): float(m.group(2)) for m in
                 re.finditer(r"^  (Python thread|MLX CPU stream thread|small-row kernel "
                             r"workers|other threads \(BLAS workers\))\s+([\d.]+) ms", out, re.M)}
    assert by_thread.get("Python thread", 0) > 0, out
    if _small_gemm.max_rows:
        # The stream thread runs every op of the step: it cannot be idle.
        assert by_thread.get("MLX CPU stream thread", 0) > 0, out
