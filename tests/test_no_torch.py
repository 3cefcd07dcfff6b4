"""The default path without torch: the README's first command, a GGUF conversion and a
load of its output, as subprocesses on a machine where torch looks uninstalled.

torch is a test oracle only (docs/architecture.md, invariants), but it is installed where the tests
run, so each subprocess hides it: ``hide_torch/sitecustomize.py`` swaps the import system's
path finder for one that finds neither the ``torch`` module nor its distribution metadata,
which is what transformers checks (conftest.py puts it before every test's subprocesses;
here it is put first explicitly, with nothing else of the test environment). HOME is a
fresh directory, so no tokenizer cached by an earlier run is used.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HIDE_TORCH
from mlx_lm_batched.loading import demo_models

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``run(*args)``: ``python *args`` without torch and with an empty HOME."""
    root = tmp_path_factory.mktemp("no_torch")
    (root / "home").mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLX_LM_BATCHED_", "HF_", "TRANSFORMERS_"))}
    package_root = str(Path(__file__).resolve().parents[1])
    env.update(HOME=str(root / "home"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(HIDE_TORCH), package_root, env.get("PYTHONPATH", "")]))

    def run(*args, timeout=600):
        proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    # The hiding works: no module, no metadata, and transformers sees no torch.
    check = ("import importlib.metadata as m, importlib.util as u, transformers\n"
             "assert u.find_spec('torch') is None and not transformers.is_torch_available()\n"
             "try:\n    m.version('torch')\nexcept m.PackageNotFoundError:\n    print('no torch')\n")
    assert run("-c", check).stdout.strip() == "no torch"
    run.home = root / "home"
    return run


def _answer(stdout):
    """The generated text of the CLI's one prompt (after its ``==== --prompt #1 ====`` line)."""
    lines = stdout.splitlines()
    return "\n".join(lines[lines.index("==== --prompt #1 ====") + 1:]).strip()


@pytest.mark.slow
def test_readme_command_convert_and_load_without_torch(run, tmp_path):
    try:
        demo_models.smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    cli = ["-m", "mlx_lm_batched.generate", "--no-progress", "--prompt", PROMPT, "--max-tokens", 12]
    # The README's first command: the default model is the SmolLM2 GGUF. transformers'
    # advice about its models (which need torch) is not shown: none of them is used.
    proc = run(*cli)
    assert "PyTorch was not found" not in proc.stderr
    answer = _answer(proc.stdout)
    assert "Paris" in answer
    cached = list((run.home / ".cache" / "mlx_lm_batched" / "gguf_tokenizers").glob("*/tokenizer.json"))
    assert len(cached) == 1  # built here, in the empty HOME
    # convert from the GGUF, then generate from the MLX directory it wrote: same weights
    # (still quantized), same tokenizer, so the same greedy answer.
    out = tmp_path / "smol_mlx"
    run("-m", "mlx_lm_batched.convert", "--hf-path", demo_models.smollm2_gguf_path(), "--mlx-path", out)
    assert (out / "tokenizer.json").is_file() and (out / "chat_template.jinja").is_file()
    assert _answer(run(*cli, "--model", out).stdout) == answer


@pytest.mark.slow
def test_gemma3_gguf_without_torch(run):
    try:
        path = demo_models.gemma3_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    proc = run("-m", "mlx_lm_batched.generate", "--no-progress", "--model", path, "--prompt", PROMPT,
               "--max-tokens", 8)
    assert "Paris" in _answer(proc.stdout)
