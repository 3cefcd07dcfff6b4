"""The README's example runs as written, and its architecture table is the registry's."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_architecture_table_matches_registry():
    sys.path.insert(0, str(ROOT / "scripts"))
    from arch_table import table

    section = re.search(r"<!-- arch-table:start -->\n(.*?)\n<!-- arch-table:end -->", README, re.S)
    assert section, "README lost its architecture table markers"
    assert section.group(1) == table(), "run python scripts/update_readme_table.py"


def test_python_example_runs_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "README has no Python example"
    for code in blocks:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=tmp_path, timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = proc.stdout.splitlines()
        assert sum("->" in line for line in lines) == 3
        assert "Paris" in proc.stdout and "Bonjour" in proc.stdout  # answered by the real model
        assert "generated tokens/s" in proc.stdout
