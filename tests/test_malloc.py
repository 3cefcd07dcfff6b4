"""glibc's malloc thresholds (``mlx_lm_batched._malloc``): MLX's CPU allocator caches only 32
MiB of freed arrays and frees the rest, and with glibc's defaults arrays of a few MB come
back as fresh pages that fault in again on every use. ``import mlx_lm_batched`` keeps them
in the heap."""

import json
import os
import subprocess
import sys

import pytest

from mlx_lm_batched import _malloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fused SiLU of a (4, 256, 1536) prefill activation, 10 times: 6 MB per array.
PROBE = """
import json, resource, sys
import mlx_lm_batched
from mlx_lm_batched import _malloc
import mlx.core as mx
from mlx_lm_batched.layers import cpu_ops
x = mx.random.normal((4, 256, 1536))
mx.eval(x, cpu_ops.silu(x))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    mx.eval(cpu_ops.silu(x))
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"configured": _malloc.configured, "faults": faults}))
"""


def probe(choice, code=PROBE):
    """The JSON line ``code`` prints last, run in a fresh process with
    ``MLX_LM_BATCHED_MALLOC=choice`` and none of glibc's own malloc settings."""
    env = dict(os.environ, MLX_LM_BATCHED_MALLOC=choice, PYTHONPATH=REPO)
    for name in _malloc.GLIBC_ENV:
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _malloc.supported(), reason="the thresholds are glibc's (Linux)")
def test_freed_arrays_do_not_fault_in_again():
    ours, system = probe("auto"), probe("system")
    assert ours["configured"] is True and system["configured"] is False
    pages_per_call = 4 * 256 * 1536 * 4 // 4096  # one output array's pages
    # glibc's defaults: the outputs (and the fused kernel's temporaries) fault in again on
    # every call; ours: they reuse the pages of the previous call's freed arrays.
    assert system["faults"] >= 10 * pages_per_call, system
    assert ours["faults"] <= pages_per_call, ours


def test_unknown_choice_warns_and_keeps_auto():
    env = dict(os.environ, MLX_LM_BATCHED_MALLOC="jemalloc", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", "import mlx_lm_batched._malloc as m; print(m.requested())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "auto"
    assert "MLX_LM_BATCHED_MALLOC='jemalloc' is not one of auto, system" in out.stderr


RELEASE_PROBE = """
import json
import mlx_lm_batched
from mlx_lm_batched import _malloc
import mlx.core as mx

release = _malloc.HeapRelease(every_s=0.0)
xs = [mx.ones((1 << 20,)) for _ in range(100)]  # 100 arrays of 4 MB: heap, not mmap
mx.eval(xs)
del xs
held = _malloc.resident_bytes()
idle = release.tick()  # no row left: nothing released
release.rows_left()
released = release.tick()
after = _malloc.resident_bytes()
print(json.dumps({"held": held, "after": after, "idle": idle, "released": released,
                  "again": release.tick()}))
"""


@pytest.mark.skipif(not _malloc.supported(), reason="malloc_trim is glibc's (Linux)")
@pytest.mark.parametrize("choice", ["auto", "system"])
def test_freed_heap_goes_back_to_the_system_after_rows_leave(choice):
    """``HeapRelease``: after rows leave, the next tick gives the heap's free pages back
    (the resident size drops by the 400 MB of freed arrays); without rows leaving, or
    again right after, nothing; ``MLX_LM_BATCHED_MALLOC=system`` leaves malloc alone."""
    r = probe(choice, RELEASE_PROBE)
    assert r["idle"] is False and r["again"] is False, r
    if choice == "system":
        assert r["released"] is False, r
    else:
        assert r["released"] is True, r
        assert r["held"] - r["after"] >= 300 << 20, r


CEILING_PROBE = """
import json
import mlx_lm_batched
from mlx_lm_batched import _malloc
import mlx.core as mx

mx.set_cache_limit(0)  # freed arrays go straight to free()
xs = [mx.ones((1 << 20,)) for _ in range(100)]  # 400 MB of 4 MB arrays: heap, not mmap
mx.eval(xs)
del xs
held = _malloc.resident_bytes()
under = _malloc.ResidentCeiling(held + (1 << 30)).look()  # under its ceiling: kept
ceiling = _malloc.ResidentCeiling(held - (100 << 20))
over = ceiling.look()
after = _malloc.resident_bytes()
again = ceiling.look()  # under the ceiling now
print(json.dumps({"held": held, "after": after, "under": under, "over": over,
                  "again": again, "started": ceiling.start()}))
ceiling.stop()
"""


@pytest.mark.skipif(not _malloc.supported(), reason="malloc_trim is glibc's (Linux)")
@pytest.mark.parametrize("choice", ["auto", "system"])
def test_freed_heap_goes_back_above_a_resident_ceiling(choice):
    """``ResidentCeiling``: under its ceiling a look keeps the heap's 400 MB of freed
    arrays; above it, gives them back (the resident size drops by them), then, under it
    again, nothing. ``MLX_LM_BATCHED_MALLOC=system`` leaves malloc alone."""
    r = probe(choice, CEILING_PROBE)
    assert r["under"] is False and r["again"] is False, r
    if choice == "system":
        assert r["over"] is False and r["started"] is False, r
    else:
        assert r["over"] is True and r["started"] is True, r
        assert r["held"] - r["after"] >= 300 << 20, r
