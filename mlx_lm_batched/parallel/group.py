"""The distributed group a run shards over, and what keeps its ranks in step: one seed
for every rank, and a watchdog that turns a lost or stalled peer into a clear exit."""

import os
import sys
import threading
import time

import mlx.core as mx

MODES = ("auto", "tensor", "pipeline", "off")


# Seconds the CLI may go without a generated token before the watchdog decides a peer is
# gone (a long prefill chunk counts too); MLX_LM_BATCHED_DIST_TIMEOUT overrides it.
STEP_TIMEOUT = float(os.environ.get("MLX_LM_BATCHED_DIST_TIMEOUT", "") or 300.0)


def group_for(mode="auto"):
    """The group to shard over for ``mode`` (the CLI's ``--distributed``), or None.

    ``auto``: the group of ``mx.distributed.init()`` when it has more than one rank (as
    under ``mlx.launch``; sharded as ``tensor``); ``tensor`` and ``pipeline``: that group,
    required; ``off``: None.
    """
    if mode not in MODES:
        raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return None
    group = mx.distributed.init()
    if group.size() > 1:
        return group
    if mode in ("tensor", "pipeline"):
        raise ValueError(f"{mode} parallelism needs more than one rank: start the command "
                         "with `mlx.launch -n 2 --backend ring -- ...`")
    return None


def shared_seed(group, seed=None):
    """``seed``, or rank 0's random seed, identical on every rank (sampling must agree)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") >> 1 if group.rank() == 0 else 0
        seed = mx.distributed.all_sum(mx.array(seed if group.rank() == 0 else 0, mx.int32),
                                      stream=mx.cpu, group=group).item()
    return seed


class guard_collectives:
    """Context manager that turns a lost or stalled peer into a clear exit, not a hang.

    A peer that dies makes MLX's collectives raise ``RuntimeError``; inside the block that
    becomes ``SystemExit`` with one line naming this rank. A peer that stalls is caught by
    a watchdog thread: when ``timeout`` seconds pass without :meth:`tick` (call it once
    per step), the process prints the error and exits with status 1.
    """

    def __init__(self, timeout=120.0, group=None):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self.rank = (group or mx.distributed.init()).rank()
        self._deadline = None
        self._done = threading.Event()

    def tick(self):
        """Progress was made: restart the watchdog's clock."""
        self._deadline = time.monotonic() + self.timeout

    def _watch(self):
        while not self._done.wait(0.5):
            if time.monotonic() > self._deadline:
                print(f"[rank {self.rank}] error: no progress from the distributed group for "
                      f"{self.timeout:g} s (a peer stalled or died); exiting", file=sys.stderr,
                      flush=True)
                os._exit(1)

    def __enter__(self):
        self.tick()
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._done.set()
        if exc_type is RuntimeError and ("[ring]" in str(exc) or "peer" in str(exc)):
            raise SystemExit(f"[rank {self.rank}] error: lost a peer of the distributed "
                             f"group ({exc})") from exc
        return False
