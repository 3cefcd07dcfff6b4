"""The OpenBLAS preload: used when present, off by environment variable, same results."""

import json
import os
import subprocess
import sys

import pytest

PROBE = r'''
import json, sys
sys.path.insert(0, "tests")
import mlx_lm_batched, mlx_lm_batched._blas as blas
import mlx.core as mx
from arch_harness import build_hf_model, save_hf_model, BASE_SMALL
from mlx_lm_batched.utils import load_model
import tempfile
mx.random.seed(0)
a = mx.random.normal((256, 384)); b = mx.random.normal((384, 200))
with tempfile.TemporaryDirectory() as d:
    save_hf_model(build_hf_model("llama", BASE_SMALL), d, "transformers5")
    model, _ = load_model(d)
logits = model(mx.array([[5, 9, 17, 33, 2, 7]]))
print(json.dumps({"blas": blas.loaded_path, "matmul": (a @ b).tolist(),
                  "logits": logits[0, -1].tolist()}))
'''


def run_probe(disable):
    env = dict(os.environ)
    env.pop("MLX_LM_BATCHED_NO_OPENBLAS", None)
    if disable:
        env["MLX_LM_BATCHED_NO_OPENBLAS"] = "1"
    root = os.path.dirname(os.path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the preload is Linux-only")
def test_openblas_results_agree_with_bundled_blas():
    import numpy as np
    from mlx_lm_batched._blas import _find_openblas

    fast, slow = run_probe(disable=False), run_probe(disable=True)
    assert slow["blas"] is None
    # CI installs libopenblas0-pthread; wherever the library exists it must be used.
    assert fast["blas"] == _find_openblas()
    np.testing.assert_allclose(fast["matmul"], slow["matmul"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fast["logits"], slow["logits"], rtol=1e-4, atol=1e-4)
