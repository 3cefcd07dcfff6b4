"""Samples a server's memory from inside it, for ``scripts/memory_timeline.py``.

    MEMORY_SAMPLER_DIR=/tmp/mem PYTHONPATH=$PWD/scripts/memory_sampler:$PWD \\
        python scripts/bench_kv_bound.py --model DIR ...

Python imports this file (``usercustomize``, after any ``sitecustomize``, unless the
user site is off: ``-s``, ``PYTHONNOUSERSITE``) at start in every process whose
``PYTHONPATH`` names this folder; it acts only in ``python -m mlx_lm_batched.server`` processes and only when
``MEMORY_SAMPLER_DIR`` is set. The folder goes on ``PYTHONPATH`` as an absolute path:
``bench_kv_bound.py`` starts its server in another working directory. A daemon thread then writes, every 20 ms, one line to
``DIR/timeline-PID.txt``: seconds since start, resident bytes (``/proc/self/statm``),
glibc's heap (``mallinfo2``: bytes obtained from the system, in use, free, and in
mmapped chunks) and MLX's active and cache bytes. While MLX's active memory is above
``MEMORY_SAMPLER_STACKS_ABOVE`` bytes (unset: never), it appends the Python stacks of
the package's threads to ``DIR/stacks.txt``, at most once a second: what the engine was
doing when its arrays peaked. Linux with glibc 2.33+ only (``mallinfo2``).
"""

import ctypes
import os
import sys
import threading
import time
import traceback

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
           "uordblks", "fordblks", "keepcost")


# glibc's struct mallinfo2 and the /proc read below are written out again rather than
# taken from ``mlx_lm_batched._malloc``: importing the package here, at interpreter start,
# would load MLX and the BLAS before the server chooses how (``mlx_lm_batched._blas``).
class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _mlx_bytes():
    mx = sys.modules.get("mlx.core")
    try:  # mlx.core may still be importing
        return mx.get_active_memory(), mx.get_cache_memory()
    except AttributeError:
        return 0, 0


def _stacks(out, seconds, active):
    out.write(f"=== t={seconds:.2f} active={active / 1e9:.3f} GB\n")
    for frame in sys._current_frames().values():
        stack = traceback.extract_stack(frame)
        if any("mlx_lm_batched" in f.filename for f in stack):
            out.write("".join(traceback.format_list(stack[-14:])) + "---\n")


def _sample(folder, stacks_above):
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    page = os.sysconf("SC_PAGE_SIZE")
    start, last_stacks = time.monotonic(), 0.0
    with open(os.path.join(folder, f"timeline-{os.getpid()}.txt"), "w") as log:
        while True:
            with open("/proc/self/statm") as f:
                resident = int(f.read().split()[1]) * page
            heap = mallinfo2()
            active, cache = _mlx_bytes()
            now = time.monotonic() - start
            log.write(f"{now:.2f} {resident} {heap.arena} {heap.uordblks} {heap.fordblks} "
                      f"{heap.hblkhd} {active} {cache}\n")
            log.flush()
            if active > stacks_above and now - last_stacks >= 1.0:
                last_stacks = now
                with open(os.path.join(folder, "stacks.txt"), "a") as out:
                    _stacks(out, now, active)
            time.sleep(0.02)


if os.environ.get("MEMORY_SAMPLER_DIR") and \
        "mlx_lm_batched.server" in getattr(sys, "orig_argv", []):
    os.makedirs(os.environ["MEMORY_SAMPLER_DIR"], exist_ok=True)
    threading.Thread(target=_sample, daemon=True, args=(
        os.environ["MEMORY_SAMPLER_DIR"],
        float(os.environ.get("MEMORY_SAMPLER_STACKS_ABOVE", "inf")))).start()
