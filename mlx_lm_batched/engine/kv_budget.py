"""How much key/value cache and recurrent state a batch needs, and whether the
machine has it.

The batch driver checks this before a batch starts: a request whose caches could
never fit fails at once with a clear message instead of exhausting memory (or
crashing the process) many tokens later.
"""

import os
import weakref

import mlx.core as mx

# Keys of ``mx.device_info()`` giving the memory a device can use, best first.
_DEVICE_MEMORY_KEYS = ("max_recommended_working_set_size", "memory_size", "total_memory")


def _probe(model):
    """Per cache of ``make_prompt_cache(model)``: ``(bytes per slot, fixed bytes)`` of
    one row, or None for a cache kind this module does not know.

    The model is called on one token with fresh caches and nothing is evaluated: MLX
    is lazy, so the caches' arrays have their shapes and dtypes (the model's real
    key/value and recurrent-state layouts, whatever the family) without memory or
    compute spent on them. A model whose forward pass communicates (a pipeline stage)
    fills them through its own ``probe_caches(cache)`` instead."""
    from ..cache.factory import make_prompt_cache
    from ..cache.state import StateCache

    cache = make_prompt_cache(model)
    if hasattr(model, "probe_caches"):  # its forward pass communicates (a pipeline stage)
        model.probe_caches(cache)
    else:
        model(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
    layout = []
    for c in cache:
        if isinstance(c, StateCache):  # recurrent state: fixed per row
            layout.append((0, c.nbytes))
        elif getattr(c, "keys", None) is not None:  # keys/values: (1, heads, slots, dim)
            # Also the item size: quantized caches keep scales and biases in it.
            layout.append(((c.keys.nbytes + c.values.nbytes) // c.keys.shape[2], 0,
                           c.keys.itemsize))
        else:
            layout.append(None)
    return tuple(layout)


_LAYOUTS = {}  # id(model) -> (weak reference to the model, its probed layout)


def cache_layout(model, kv_quant=None):
    """``(bytes per slot, fixed bytes)`` one row takes in each of the model's caches
    (None for an unknown kind), probed once per model (see ``_probe``).

    ``kv_quant`` (a ``KVQuantization``): the key/value bytes once quantized, ``bits``
    per value plus a scale and a bias (in the cache's dtype) per ``group_size`` values.
    """
    ref, probed = _LAYOUTS.get(id(model), (None, None))
    if ref is None or ref() is not model:
        probed = {"probe": _probe(model)}
        # Drop the entry with the model (a later model may reuse its id).
        _LAYOUTS[id(model)] = (weakref.ref(model, lambda _, key=id(model): _LAYOUTS.pop(key, None)),
                               probed)
    key = None if kv_quant is None else (kv_quant.bits, kv_quant.group_size)
    if key not in probed:  # one tuple per setting: callers may compare by identity
        probed[key] = tuple(_quantized(entry, kv_quant) for entry in probed["probe"])
    return probed[key]


def _quantized(entry, kv_quant):
    if entry is None or len(entry) == 2:
        return entry
    per_slot, fixed, itemsize = entry
    if kv_quant is None:
        return per_slot, fixed
    values = per_slot // itemsize
    return (values * kv_quant.bits // 8
            + -(-values // kv_quant.group_size) * 2 * itemsize), fixed


def quantized_need(slots, float_per_slot, quant_per_slot, start):
    """Peak key/value bytes of a row growing to ``slots`` slots when its caches switch
    to quantized at ``start`` slots: float until then, quantized after."""
    if slots < start:
        return slots * float_per_slot
    return max(start * float_per_slot, slots * quant_per_slot)


def cache_bytes(model, cache, rows, slots, kv_quant=None):
    """``(key/value bytes, recurrent-state bytes)`` of ``rows`` rows holding ``slots``
    slots each in ``cache`` (rotating layers hold at most their ring; a state cache
    holds the same bytes whatever the length; quantized with ``kv_quant`` once past
    its ``start``), or None when unknown."""
    if kv_quant is not None and slots >= kv_quant.start:
        layout = cache_layout(model, kv_quant)
    else:
        layout = cache_layout(model)
    caches = list(cache)
    if len(layout) != len(caches) or any(entry is None for entry in layout):
        return None
    kv = state = 0
    for (per_slot, fixed), c in zip(layout, caches):
        kv += rows * min(slots, getattr(c, "max_size", None) or slots) * per_slot
        state += rows * fixed
    return kv, state


def available_memory():
    """Bytes the device (or, for the CPU, the system) can still give, or None."""
    try:
        info = mx.device_info()
    except Exception:  # older MLX, or no device query on this backend
        info = {}
    for key in _DEVICE_MEMORY_KEYS:
        value = info.get(key)
        if isinstance(value, int) and value > 0:
            return value - mx.get_active_memory()
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") - mx.get_active_memory()
    except (ValueError, OSError, AttributeError):
        return None


def check_kv_fits(model, cache, rows, slots, kv_quant=None):
    """Raise ``ValueError`` when ``rows`` rows of ``slots`` slots (key/value cache plus
    each row's recurrent state, for hybrid and state-space models) cannot fit in memory."""
    parts = cache_bytes(model, cache, rows, slots, kv_quant)
    have = available_memory()
    if parts is None or have is None or sum(parts) <= have:
        return
    kv, state = parts
    what = ("KV cache and recurrent state" if kv and state
            else "KV cache" if kv else "recurrent state")
    lower = "max_tokens or the batch size" if kv else "the batch size"
    raise ValueError(
        f"this batch needs ~{sum(parts) / 1e9:.1f} GB of {what} ({rows} rows x {slots} slots), "
        f"more than the {max(have, 0) / 1e9:.1f} GB available; lower {lower}"
    )


# What a server leaves free beside its KV budget by default: 10% of the memory
# available after the weights are loaded, at least this many bytes (activations of a
# prefill chunk, the tokenizer, the HTTP side, the allocator's slack).
DEFAULT_MARGIN_BYTES = 1 << 30


def kv_memory_budget(setting, available, held_elsewhere=0):
    """Bytes of KV cache and state admitted requests may reserve in all.

    ``setting``: None for the default (what ``available`` leaves after
    ``held_elsewhere``, e.g. the prefix cache's bound, and a margin), a string
    ``"N%"`` for that share of ``available``, or a number of GB. ``available``: bytes
    free now (``available_memory()``, after the weights), or None when unknown (then
    only an explicit GB setting bounds). Raises ValueError on a malformed setting."""
    if setting is None:
        if available is None:
            return None
        margin = max(DEFAULT_MARGIN_BYTES, available // 10)
        return max(0, available - held_elsewhere - margin)
    text = str(setting).strip()
    try:
        value = float(text[:-1] if text.endswith("%") else text)
    except ValueError:
        value = -1.0
    if not value > 0 or (text.endswith("%") and value > 100):
        raise ValueError(f"--kv-memory must be a number of GB > 0 or a share like '50%', "
                         f"got {setting!r}")
    if text.endswith("%"):
        if available is None:
            raise ValueError("--kv-memory as a share needs the available memory, which this "
                             "device does not report: give it in GB")
        return int(available * value / 100)
    return int(value * 1e9)


# The prefix cache's default memory bound (``--prompt-cache-bytes``).
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
# Of an explicit KV bound, the share the prefix cache's blocks get by default: 1/4.
PREFIX_CACHE_SHARE = 4


def split_kv_bound(bound, prefix_cache_bytes=None, prefix_cache_on=True):
    """``(bytes admitted requests may reserve, the prefix cache's bound)`` under an explicit
    KV bound (``--kv-memory`` / ``--max-kv-bytes``): the prefix cache's KV blocks are KV
    memory too, so unless its bound is given (``prefix_cache_bytes``; then the two are
    separate, as given) it takes a quarter of ``bound`` (at most the default 1 GiB) and
    admission the rest. With the prefix cache off, admission gets the whole bound."""
    if prefix_cache_bytes is not None:
        return bound, prefix_cache_bytes
    if not prefix_cache_on:
        return bound, DEFAULT_PREFIX_CACHE_BYTES
    share = min(DEFAULT_PREFIX_CACHE_BYTES, bound // PREFIX_CACHE_SHARE)
    return bound - share, share
