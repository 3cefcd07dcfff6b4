"""``scripts/bench_targets.sh``, the run behind docs/performance.md's four target tables:
its arguments are checked before anything runs (a full run takes most of an hour and
needs llama.cpp's build, so the suite runs its checks, not the benchmarks)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_targets.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="a bash script")


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def test_help_lists_the_four_targets():
    done = run("--help")
    assert done.returncode == 0
    for target in ("1. quantized decode", "2. one stream", "3. float32 prefill",
                   "4. a model whose float32 weights exceed half the memory"):
        assert target in done.stdout
    assert "set -euo" not in done.stdout  # the comment block only


def test_an_unknown_argument_is_one_line_and_exit_2(tmp_path):
    done = run("--out", str(tmp_path / "out"), "--quick")
    assert done.returncode == 2
    assert done.stderr.strip() == "bench_targets.sh: unknown argument --quick"
    assert not (tmp_path / "out").exists()


def test_a_missing_large_model_stops_before_any_work(tmp_path):
    missing = tmp_path / "absent.gguf"
    done = run("--out", str(tmp_path / "out"), "--targets", "4", "--big-gguf", str(missing))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "make_random_gguf.py" in lines[0]
    assert not (tmp_path / "out").exists()
    assert os.access(SCRIPT, os.X_OK)
