"""``import mlx.core`` before ``mlx_lm_batched`` (most mlx-lm code starts so): MLX's
matmuls must still reach the fast BLAS and the small-row kernel, not the reference BLAS
MLX's Linux wheel links (``_blas._rebind_late``, ``native/rebind.c``).

Each import order runs in its own process. The proof is in the bits: MLX's own matmul
gives the same bytes as with ``mlx_lm_batched`` imported first, and different ones with
the bundled BLAS (so the check can fail); a real model's prefill and decode agree too.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the BLAS preload and the rebinding are Linux-only")

PROBE = r'''
import hashlib, json, sys
FIRST = sys.argv[1] == "first"
if FIRST:
    import mlx_lm_batched
import mlx.core as mx
import numpy as np
import mlx_lm_batched, mlx_lm_batched._blas as blas
from mlx_lm_batched import load

rng = np.random.default_rng(0)
w = mx.array(rng.standard_normal((1536, 576), dtype=np.float32))
digests = {}
for rows in (4, 300):  # the small-row kernel's size, the BLAS's
    x = mx.array(rng.standard_normal((rows, 576), dtype=np.float32))
    digests[rows] = hashlib.sha256(np.array(mx.matmul(x, w.T)).tobytes()).hexdigest()
model, tok = load(sys.argv[2])
prompt = tok.encode("The history of the printing press begins in " * 12)  # over 64 rows
logits = model(mx.array([prompt]))[0, -1]
print(json.dumps({"describe": blas.describe(), "digests": digests, "tokens": len(prompt),
                  "logits": hashlib.sha256(np.array(logits).tobytes()).hexdigest()}))
'''

ENV_VARS = ("MLX_LM_BATCHED_BLAS", "MLX_LM_BATCHED_NO_OPENBLAS", "MLX_LM_BATCHED_OPENBLAS",
            "MLX_LM_BATCHED_SMALL_GEMM")


def probe(order, model, **env_overrides):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(env_overrides)
    proc = subprocess.run([sys.executable, "-c", PROBE, order, str(model)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_mlx_core_imported_first_still_gets_the_fast_blas(smol_path):
    first, _ = probe("first", smol_path)
    assert not first["describe"].startswith("bundled"), "no fast BLAS on this machine"
    assert first["tokens"] > 64  # the prefill's projections go to the BLAS
    late, err = probe("late", smol_path)
    assert "warning" not in err, err
    assert late["describe"] == first["describe"]
    assert late["digests"] == first["digests"]
    assert late["logits"] == first["logits"]
    # The reference BLAS rounds otherwise: the same check tells the libraries apart.
    bundled, _ = probe("late", smol_path, MLX_LM_BATCHED_BLAS="none")
    assert bundled["describe"] == "bundled (reference)"
    assert bundled["digests"]["300"] != first["digests"]["300"]
    assert bundled["logits"] != first["logits"]


def test_late_import_without_the_small_row_kernel_binds_the_blas(smol_path):
    # The rebinding takes whatever definition leads the global scope: here the BLAS.
    first, _ = probe("first", smol_path, MLX_LM_BATCHED_SMALL_GEMM="off")
    late, err = probe("late", smol_path, MLX_LM_BATCHED_SMALL_GEMM="off")
    assert "warning" not in err, err
    assert late["describe"] == first["describe"] and "small-row kernel off" in late["describe"]
    assert late["digests"] == first["digests"]
    assert late["logits"] == first["logits"]
