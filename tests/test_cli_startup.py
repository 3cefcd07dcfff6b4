"""The package imports lazily, so the CLI starts (and handles Ctrl-C) before MLX loads,
while mlx-lm's import style keeps working."""

import os
import subprocess
import sys

CHECK = """
import sys
import mlx_lm_batched
heavy = [m for m in ("mlx.core", "transformers", "mlx_lm_batched.generate") if m in sys.modules]
assert not heavy, heavy
from mlx_lm_batched import load, generate, stream_generate, batch_generate, convert
import mlx_lm_batched.generate, mlx_lm_batched.convert
# As with mlx-lm's eager __init__: the package attribute is the function, not the module.
assert mlx_lm_batched.generate is generate and callable(generate), mlx_lm_batched.generate
assert mlx_lm_batched.convert is convert and callable(convert)
from mlx_lm_batched.generate import generate_step, GenerationResponse
assert mlx_lm_batched.generate_step is generate_step
assert sorted(mlx_lm_batched.__all__) == sorted(
    ["load", "generate", "stream_generate", "batch_generate", "stream_batch_generate",
     "generate_step", "GenerationResponse", "BatchResponse", "convert"])
assert "load" in dir(mlx_lm_batched)
try:
    mlx_lm_batched.no_such_name
except AttributeError as e:
    assert "no_such_name" in str(e)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""


def test_package_imports_lazily_and_keeps_the_mlx_lm_names():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
