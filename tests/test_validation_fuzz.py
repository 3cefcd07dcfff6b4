"""Property-style check: garbage arguments to the public API give a documented
exception (ValueError, TypeError, FileNotFoundError, NotImplementedError) or a
result, never another exception and never a signal death.

The cases run in one child process (``fuzz_api_script.py``) so that a crash is a
failed test, not a dead pytest; the seed makes a failure reproducible.
"""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "fuzz_api_script.py")
SEED, CASES = 1234, 60


def test_garbage_arguments_give_documented_errors_only(float_dirs):
    proc = subprocess.run([sys.executable, SCRIPT, str(float_dirs["smollm2"]), str(SEED),
                           str(CASES)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode} (seed {SEED}): {proc.stderr[-3000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["unexpected"] == [], "\n".join(report["unexpected"])
    counts = report["counts"]
    assert sum(counts.values()) == CASES
    # The pools mix valid and invalid values: both outcomes must actually occur.
    assert counts.get("ok", 0) >= 5 and counts.get("ValueError", 0) >= 5, counts
    assert counts.get("TypeError", 0) >= 5, counts
