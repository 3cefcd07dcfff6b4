"""``scripts/count_parameters.py``: public functions and methods with more than 8
parameters (mlx-lm's own signatures aside; model and layer constructors count) stay
none."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "count_parameters.py"
MOST = 0


def run(*args):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_long_signatures_do_not_grow():
    lines = run()
    assert int(lines[-1]) == len(lines) - 1 <= MOST, "\n".join(lines)
    assert run("--count") == [lines[-1]]


def test_the_script_finds_long_signatures_constructors_too_and_skips_mlx_lm_s(tmp_path):
    nine = ", ".join(f"p{i}" for i in range(9))
    (tmp_path / "api").mkdir()
    (tmp_path / "layers").mkdir()
    (tmp_path / "wide.py").write_text(
        f"def wide({nine}):\n    pass\n\n\ndef _private({nine}):\n    pass\n\n\n"
        f"class Thing:\n    def __init__(self, {nine}):\n        pass\n\n"
        f"    def method(self, a, *args, b=1, **kw):\n        pass\n")
    (tmp_path / "api" / "batch.py").write_text(f"def batch_generate({nine}):\n    pass\n")
    (tmp_path / "layers" / "block.py").write_text(
        f"class Block:\n    def __init__(self, {nine}):\n        pass\n\n"
        f"def helper({nine}, p9):\n    pass\n")
    assert run("--package", str(tmp_path)) == [
        "  9 layers/block.py:2 Block.__init__", " 10 layers/block.py:5 helper",
        "  9 wide.py:1 wide", "  9 wide.py:10 Thing.__init__", "4"]
    assert run("--package", str(tmp_path), "--max", "9") == [" 10 layers/block.py:5 helper", "1"]
