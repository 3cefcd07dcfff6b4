"""Keep freed arrays' memory in the heap on Linux (glibc), for MLX's CPU backend.

MLX's CPU allocator takes every array from ``malloc`` and keeps freed buffers for reuse
only up to its cache limit, 32 MiB by default on the CPU (``mx.set_cache_limit``); a
forward pass frees more than that, and the rest goes back with ``free``. glibc serves a
request above its mmap threshold (128 KB at start, raised adaptively) with a fresh
``mmap``, unmaps it on ``free``, and trims the heap whenever more than twice that
threshold is free at its top. The arrays of a forward pass (a prefill's activations,
attention scores, the exponentials of a softmax: a few MB each, allocated and freed on
every layer) then come back as new pages every time, and every page faults in and is
zeroed by the kernel (``scripts/bench_malloc.py`` measures the page faults and system
time with and without the thresholds below). The CPU
primitives (``_cpu_prims``) keep most of a forward pass's large temporaries out of MLX's
allocator; the thresholds serve the paths those primitives do not take.

:func:`configure` fixes both thresholds at import (``mallopt``), so memory freed by one
array serves the next of its size:

- ``M_MMAP_THRESHOLD`` = 32 MiB, glibc's largest: smaller arrays come from the heap;
  larger ones (a big KV cache buffer) keep their own mapping and go back to the system
  when freed.
- ``M_TRIM_THRESHOLD`` = 1 GiB: up to that much free memory at the heap's top stays
  mapped. The process's resident size stays near its peak after a burst, as MLX's Metal
  buffer cache does; ``mx.get_peak_memory`` and the arrays' memory are unchanged.

``MLX_LM_BATCHED_MALLOC=system`` leaves glibc's defaults. Nothing is done off Linux, or
with a C library other than glibc (musl has no ``mallopt``).
"""

import ctypes
import os
import sys
import threading
import time

ENV = "MLX_LM_BATCHED_MALLOC"
CHOICES = ("auto", "system")
# glibc's <malloc.h> parameter numbers.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's maximum on 64-bit (4 * 1024 * 1024 * sizeof(long))
TRIM_THRESHOLD = 1 << 30
# glibc's own ways to set the same thresholds (read at process start).
GLIBC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")

configured = False  # True once configure() has set the thresholds


def requested():
    """The choice in :data:`ENV` (``auto`` when unset or unknown)."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        sys.stderr.write(f"mlx_lm_batched: warning: {ENV}={value!r} is not one of "
                         f"{', '.join(CHOICES)}; using auto\n")
        return "auto"
    return value


def supported():
    """True on Linux with glibc, where ``mallopt`` and these thresholds exist."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def configure(choice=None):
    """Set glibc's mmap and trim thresholds (see the module docstring).

    Returns True when they are set (now or before), False when glibc's defaults stay:
    ``choice`` (default :func:`requested`) is ``system``, the platform is not Linux with
    glibc, or ``mallopt`` refused a value."""
    global configured
    if configured:
        return True
    if (choice or requested()) == "system" or not supported():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # mallopt returns 1 on success; setting either threshold also turns off glibc's
    # adaptive raising of the mmap threshold, so both are set.
    configured = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return configured


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (2.33+): ten size_t fields, fordblks the free bytes.
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_free_bytes():
    """Bytes of freed memory the heap holds (glibc's ``mallinfo2().fordblks``, every
    arena), or None where that cannot be read (not glibc, glibc before 2.33)."""
    if not supported():
        return None
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().fordblks)


def resident_bytes():
    """The process's resident memory (``/proc/self/statm``), 0 where that is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_free_heap():
    """Give the heap's free pages back to the system (glibc's ``malloc_trim(0)``: the
    free memory at the top of each arena and the whole free pages inside them). Returns
    True when some memory was released; False off glibc or with
    ``MLX_LM_BATCHED_MALLOC=system`` (which leaves malloc alone)."""
    if requested() == "system" or not supported():
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = (ctypes.c_size_t,)
    return bool(trim(0))


class HeapRelease:
    """Releases the heap's free memory after rows leave, for a serving loop.

    The trim threshold above keeps freed memory mapped so that the next forward pass
    reuses it without page faults; a server whose requests come and go would then keep
    the memory of its largest moment for good (a resident size well above the arrays it
    holds). Call :meth:`rows_left` when rows leave the batch (their caches freed) and
    :meth:`tick` once per loop: the free heap is released at the first tick at least
    ``every_s`` seconds after the previous release, when more than ``min_free_bytes`` of
    it is free. A decode step's own temporaries, freed and reused every step, are not
    released while no row leaves; the page faults after a release cost far less than a
    step."""

    def __init__(self, every_s=1.0, min_free_bytes=64 << 20):
        self.every_s, self.min_free_bytes = every_s, min_free_bytes
        self.due = False
        self._last = float("-inf")

    def rows_left(self):
        """Rows left the batch: release the free heap at a coming tick."""
        self.due = True

    def tick(self):
        """Release the free heap if due; returns True when it did."""
        now = time.monotonic()
        if not self.due or now - self._last < self.every_s:
            return False
        self.due, self._last = False, now
        free = heap_free_bytes()
        return free is not None and free >= self.min_free_bytes and release_free_heap()


class ResidentCeiling:
    """Keeps a server's resident size under a ceiling by releasing the heap's freed
    memory, from a thread that looks every ``every_s`` seconds.

    :class:`HeapRelease` gives memory back between steps, after rows leave. Within a step
    the heap can still hold much freed memory: a prefill's temporaries, freed, sit in
    holes between long-lived buffers that its later, larger ones cannot use (0.3-0.45
    GB free but resident at the peak, under a 0.5 GB KV bound with 24 distinct
    1,500-token requests of SmolLM2-135M). Releasing it at every look would make the
    pages a prefill reuses fault in again (a prefill of 5 x 1,500 tokens took 1.2-1.3x as
    long, releasing whenever 64 MiB were free); released only when the resident size is
    above ``ceiling_bytes``, it costs nothing until memory runs short. ``malloc_trim``
    waits only for each arena's lock, and ``ctypes`` lets go of the GIL meanwhile.
    """

    def __init__(self, ceiling_bytes, every_s=0.1, min_free_bytes=16 << 20):
        self.ceiling_bytes, self.every_s = int(ceiling_bytes), every_s
        self.min_free_bytes = min_free_bytes
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        """Start looking, in a daemon thread; does nothing off glibc or with
        ``MLX_LM_BATCHED_MALLOC=system``. Returns True when started."""
        if self._thread is None and requested() != "system" and \
                heap_free_bytes() is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="mlx-lm-batched-resident-ceiling")
            self._thread.start()
        return self._thread is not None

    def stop(self):
        """Stop looking (waits for the thread)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _run(self):
        while not self._stop.wait(self.every_s):
            self.look()

    def look(self):
        """One look: above the ceiling with at least ``min_free_bytes`` of the heap
        free, release it; True when memory went back."""
        if resident_bytes() <= self.ceiling_bytes:
            return False
        free = heap_free_bytes()
        return free is not None and free >= self.min_free_bytes and release_free_heap()


# At import, not on first use: the thresholds must be set before MLX allocates the first
# array (glibc's adaptive threshold has moved by then); mallopt itself costs nothing.
configure()
