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


# At import, not on first use: the thresholds must be set before MLX allocates the first
# array (glibc's adaptive threshold has moved by then); mallopt itself costs nothing.
configure()
