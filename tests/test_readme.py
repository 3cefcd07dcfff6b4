"""The README's and docs/python-api.md's examples run as written, and docs/models.md's
architecture table is the registry's."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYTHON_API = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
MODELS = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")


def test_architecture_table_matches_registry():
    sys.path.insert(0, str(ROOT / "scripts"))
    from arch_table import table

    section = re.search(r"<!-- arch-table:start -->\n(.*?)\n<!-- arch-table:end -->", MODELS, re.S)
    assert section, "docs/models.md lost its architecture table markers"
    assert section.group(1) == table(), "run python scripts/update_arch_table.py"


def python_blocks(text=README):
    """A page's Python blocks that run on their own (the server's need a running server:
    tests/test_server_openai.py runs those)."""
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "127.0.0.1:8080" not in b]


def run_block(code, tmp_path):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_python_example_runs_as_written(tmp_path):
    blocks = python_blocks()
    assert blocks, "README has no Python example"
    out = run_block(blocks[0], tmp_path)
    assert sum("->" in line for line in out.splitlines()) == 3
    assert "Paris" in out and "Bonjour" in out  # answered by the real model
    assert "generated tokens/s" in out


def test_living_batches_example_runs_as_written(tmp_path):
    blocks = [b for b in python_blocks(PYTHON_API) if "BatchGenerator" in b]
    assert len(blocks) == 1, "docs/python-api.md lost its BatchGenerator example"
    out = run_block(blocks[0], tmp_path)
    assert "Paris" in out and "Bonjour" in out  # both rows answered, the second joined mid-flight
    reused = re.search(r"reused (\d+) of (\d+) prompt tokens", out)
    assert reused and 0 < int(reused.group(1)) < int(reused.group(2))  # the first turn's cache served
    assert "Rome" in out.splitlines()[-1]  # the second turn answered on top of it


def test_quantized_kv_example_runs_as_written(tmp_path):
    blocks = [b for b in python_blocks(PYTHON_API) if "kv_bits" in b]
    assert len(blocks) == 1, "docs/python-api.md lost its kv_bits example"
    texts = eval(run_block(blocks[0], tmp_path))  # the printed list of texts
    assert len(texts) == 2 and all(t.strip() for t in texts)


def test_speculative_example_runs_as_written(tmp_path):
    blocks = [b for b in python_blocks(PYTHON_API) if "prompt_lookup=True" in b]
    assert len(blocks) == 1, "docs/python-api.md lost its speculative decoding example"
    out = run_block(blocks[0], tmp_path).splitlines()
    # One line per streamed token: its text and whether a draft proposed it.
    assert out and all(line.endswith((" True", " False")) for line in out)
    assert any(line.endswith(" True") for line in out)  # a draft equal to the model is kept


def test_every_python_block_is_tested():
    # The README: the example above and the server's openai snippet (test_server_openai.py).
    readme_blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(python_blocks()) == 1 and len(readme_blocks) == 2
    # docs/python-api.md: the three examples above, all runnable.
    api_blocks = re.findall(r"```python\n(.*?)```", PYTHON_API, re.S)
    assert len(python_blocks(PYTHON_API)) == 3 and len(api_blocks) == 3
