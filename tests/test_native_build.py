"""The native kernels' build cache: a build is done once per key, and a failed build is
remembered under the same key, so an import does not pay for the same failing compile
again; a changed source is a new key and builds again."""

import os
import stat
import subprocess
import sys

import pytest

from mlx_lm_batched import _native_build


def fake_compiler(tmp_path):
    """A compiler that counts its runs and fails on sources containing 'broken'."""
    script = tmp_path / "fake-cc"
    script.write_text("#!/bin/sh\n"
                      f"echo run >> {tmp_path}/runs\n"
                      'if grep -q broken "$1"; then echo "x.c:1: error: broken" >&2; exit 1; fi\n'
                      'for a; do last="$a"; done; echo built > "$last"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def runs(tmp_path):
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_failed_build_is_remembered_until_the_source_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cc = fake_compiler(tmp_path)
    source = tmp_path / "kernel.c"
    source.write_text("broken\n")
    for _ in range(2):
        with pytest.raises(OSError, match="building the test kernel failed: x.c:1: error: broken"):
            _native_build.cached_build("k", "test kernel", cc, [str(source)], ["-O2"])
    assert runs(tmp_path) == 1  # the second call read the remembered failure
    source.write_text("fixed\n")
    path = _native_build.cached_build("k", "test kernel", cc, [str(source)], ["-O2"])
    assert open(path).read() == "built\n" and runs(tmp_path) == 2
    assert _native_build.cached_build("k", "test kernel", cc, [str(source)], ["-O2"]) == path
    assert runs(tmp_path) == 2
    assert os.path.dirname(path) == str(tmp_path / "cache" / "mlx_lm_batched" / "native")


WAIT_POLICY_PROBE = """
import ctypes, os, sys
import mlx_lm_batched, mlx.core as mx
from mlx_lm_batched import _small_gemm
if not _small_gemm.max_rows:
    sys.exit("no kernel: " + str(_small_gemm.problem))
x = mx.random.normal((4, 64)); mx.eval(x @ x.T)  # a matmul through the kernel
ctypes.CDLL("libgomp.so.1").omp_display_env(1)  # libgomp's settings, on stderr
print(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
"""


@pytest.mark.parametrize("user_env, expected", [
    ({}, ("ACTIVE", "1000")),
    ({"OMP_WAIT_POLICY": "passive"}, ("PASSIVE", "0")),
    ({"GOMP_SPINCOUNT": "50"}, ("PASSIVE", "50")),
])
def test_kernel_threads_spin_briefly_then_sleep_unless_the_user_says_otherwise(user_env, expected):
    """The kernels' OpenMP runtime loads with a brief spin (1,000 rounds) before a thread
    sleeps: libgomp's long default spin made two processes on shared cores 22x slower,
    sleeping at once made one process 1.8x slower. The variables are not left in the
    environment for child processes, and a value the user set for either wins."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(user_env)
    done = subprocess.run([sys.executable, "-c", WAIT_POLICY_PROBE], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    policy, spin = expected
    assert f"OMP_WAIT_POLICY = '{policy}'" in done.stderr
    assert f"GOMP_SPINCOUNT = '{spin}'" in done.stderr
    # The environment the process had, for its children.
    assert done.stdout.split() == [str(user_env.get("OMP_WAIT_POLICY")),
                                   str(user_env.get("GOMP_SPINCOUNT"))]
