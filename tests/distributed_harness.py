"""Helpers for the tests that run 2 local ranks (``mlx.launch --backend ring -n 2``):
launching ``tests/dist_worker.py`` on both ranks (or starting the ranks by hand), the
tiny tokenizer the worker's checkpoints need, and a stand-in for rank 0 of 2 where
sharding needs no collective."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import arch_harness
from conftest import subprocess_env

WORKER = Path(__file__).parent / "dist_worker.py"
TIMEOUT = 240
# The mlx wheel's launcher, beside this interpreter (a venv need not be on PATH).
_BESIDE = Path(sys.executable).with_name("mlx.launch")
LAUNCH = str(_BESIDE) if _BESIDE.exists() else shutil.which("mlx.launch") or "mlx.launch"


def free_ports(n):
    """``n`` TCP ports on 127.0.0.1 that are free now."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launcher():
    """``mlx.launch`` on 2 local ring ranks, starting at a port free now (not the fixed
    default, which a concurrent run could hold)."""
    port = str(free_ports(1)[0])
    return [LAUNCH, "-n", "2", "--backend", "ring", "--starting-port", port, "--"]


def run_group(cmd, timeout, **kwargs):
    """Run ``cmd`` in a session of its own; on timeout kill the whole session (the launcher
    and its ranks), so no rank outlives the test."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env=subprocess_env(), **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err


def launch(mode, directory, timeout=TIMEOUT):
    """Run the worker on 2 ring ranks; ``(result dict or None, output, seconds)``."""
    with tempfile.TemporaryDirectory() as d:
        result = Path(d) / "result.json"
        cmd = [*launcher(), sys.executable, str(WORKER), mode, str(directory), str(result)]
        tic = time.monotonic()
        _, out, err = run_group(cmd, timeout)
        data = json.loads(result.read_text()) if result.exists() else None
        return data, out + err, time.monotonic() - tic


def assert_tensor_parallel_exact(directory, heads, mode="tensor"):
    """Launch ``mode`` on ``directory``: rank 0 passed every check and holds ``heads``
    (its query heads after sharding, and before)."""
    data, out, _ = launch(mode, directory)
    assert_tensor_parallel_result(data, out, heads, mode)


def assert_tensor_parallel_result(data, out, heads, mode="tensor"):
    """Rank 0's result ``data`` of a ``mode`` launch (``out``: the launch's output) passed
    every check and holds ``heads`` (its query heads after sharding, and before)."""
    assert data is not None, out[-3000:]
    assert "failure" not in data, data.get("failure")
    assert data["size"] == 2
    checks = ["padded logits", "greedy tokens", "rows joining BatchGenerator"]
    assert data["passed"] == (checks if mode == "tensor" else checks[:2])
    assert data["heads"] == heads  # rank 0's query heads after sharding, and before


def tiny_tokenizer(directory):
    """A byte-level tokenizer so ``load`` finds one (the worker feeds token ids)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(arch_harness.VOCAB)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "t0")),
                                  eos_token="t1", unk_token="t0")
    tok.save_pretrained(directory)


def launch_by_hand(mode, directory, tmp_path, timeout):
    """Start the 2 ring ranks ourselves (what ``mlx.launch`` does: a hostfile and
    ``MLX_RANK``), so a dying rank is not cleaned up by the launcher: rank 0 must notice
    on its own. Returns rank 0's ``(exit status, output, seconds)``."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(2)]))
    env = subprocess_env(MLX_HOSTFILE=str(hostfile))
    cmd = [sys.executable, str(WORKER), mode, str(directory), str(tmp_path / "result.json")]
    tic = time.monotonic()
    ranks = [subprocess.Popen(cmd, env=dict(env, MLX_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        out, _ = ranks[0].communicate(timeout=timeout)
        return ranks[0].returncode, out, time.monotonic() - tic
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.communicate()


class TwoRanks:
    """Stands in for rank 0 of a 2-rank group where sharding needs no collective."""

    def size(self):
        return 2

    def rank(self):
        return 0
