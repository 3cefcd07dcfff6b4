"""The CPU BLAS choice: every library on the machine gives the same model outputs,
the environment variable is honoured, and a fast BLAS is actually loaded.

Each library runs in its own process (the BLAS is chosen once, before mlx.core).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the BLAS preload is Linux-only")

PROBE = r'''
import json, sys
import mlx_lm_batched, mlx_lm_batched._blas as blas
import mlx.core as mx
from mlx_lm_batched import load, stream_generate
model, tok = load(sys.argv[1])
prompt = tok.encode("The capital of France is a city where")
logits = model(mx.array([prompt]))[0, -1]
tokens = [r.token for r in stream_generate(model, tok, prompt, max_tokens=8)]
print(json.dumps({"kind": blas.loaded_kind, "describe": blas.describe(),
                  "logits": logits.tolist(), "tokens": tokens}))
'''

ENV_VARS = ("MLX_LM_BATCHED_BLAS", "MLX_LM_BATCHED_NO_OPENBLAS", "MLX_LM_BATCHED_OPENBLAS")


def run_probe(model_dir, **env_overrides):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(env_overrides)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(model_dir)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def available():
    from mlx_lm_batched import _blas

    return [k for k, find in (("mkl", _blas.find_mkl), ("openblas", _blas.find_openblas))
            if find()]


def test_a_fast_blas_is_present():
    # CI gets MKL from the package's dependency (Linux x86-64) and OpenBLAS from apt
    # (.ci/run); without either, MLX's CPU matmuls run at a few GFLOP/s.
    import platform

    found = available()
    assert found, "neither MKL (pip install mkl) nor OpenBLAS (libopenblas0-pthread) found"
    if platform.machine() == "x86_64":
        assert "mkl" in found, "the mkl dependency should be installed on Linux x86-64"


def test_every_blas_gives_the_same_outputs(float_dirs):
    model_dir = float_dirs["smollm2"]
    bundled, _ = run_probe(model_dir, MLX_LM_BATCHED_BLAS="none")
    assert bundled["kind"] is None and bundled["describe"] == "bundled (reference)"
    for kind in available():
        fast, err = run_probe(model_dir, MLX_LM_BATCHED_BLAS=kind)
        assert fast["kind"] == kind, err
        assert fast["describe"].startswith(kind + " ")
        np.testing.assert_allclose(fast["logits"], bundled["logits"], rtol=1e-4, atol=2e-4)
        assert fast["tokens"] == bundled["tokens"]


def test_auto_loads_a_fast_blas_and_the_old_switches_still_work(float_dirs):
    from mlx_lm_batched import _blas

    model_dir = float_dirs["smollm2"]
    auto, _ = run_probe(model_dir)
    # auto prefers MKL on Intel CPUs and a system OpenBLAS on others.
    expected = [k for k in _blas._auto_order() if k in available()][0]
    assert auto["kind"] == expected
    off, _ = run_probe(model_dir, MLX_LM_BATCHED_NO_OPENBLAS="1")
    assert off["kind"] is None
    if _blas.find_openblas():
        chosen, _ = run_probe(model_dir, MLX_LM_BATCHED_OPENBLAS=_blas.find_openblas())
        assert chosen["kind"] == "openblas"


def test_unavailable_or_unknown_choice_is_reported(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    code = "import mlx_lm_batched._blas as b; print(b.describe())"
    missing = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(env, MLX_LM_BATCHED_BLAS="openblas",
                                      MLX_LM_BATCHED_OPENBLAS=str(tmp_path / "nope.so")))
    assert missing.returncode == 0 and missing.stdout.strip() == "bundled (reference)"
    warning = missing.stderr.strip().splitlines()
    assert len(warning) == 1 and "MLX_LM_BATCHED_BLAS=openblas" in warning[0]
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(env, MLX_LM_BATCHED_BLAS="fastest"))
    assert bad.returncode != 0
    assert "ValueError: MLX_LM_BATCHED_BLAS='fastest': expected one of auto, mkl, openblas, none" \
        in bad.stderr
