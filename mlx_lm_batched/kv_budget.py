"""How much key/value cache a batch needs, and whether the machine has it.

The batch driver checks this before a batch starts: a request whose caches could
never fit fails at once with a clear message instead of exhausting memory (or
crashing the process) many tokens later.
"""

import os

import mlx.core as mx
from mlx.utils import tree_flatten

# Keys of ``mx.device_info()`` giving the memory a device can use, best first.
_DEVICE_MEMORY_KEYS = ("max_recommended_working_set_size", "memory_size", "total_memory")


def model_context(model):
    """The model's context length (positions it was trained for), or None."""
    args = getattr(model, "args", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(args, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _compute_dtype(model):
    for _, p in tree_flatten(model.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.float32


def _slot_elements(layer):
    """Key and value elements one slot of one row takes in ``layer``'s cache."""
    attn = getattr(layer, "self_attn", None)
    if hasattr(attn, "kv_lora_rank"):  # MLA caches expanded per-head keys and values
        return attn.n_heads * (attn.qk_nope_head_dim + attn.qk_rope_head_dim + attn.v_head_dim)
    if hasattr(attn, "n_kv_heads") and hasattr(attn, "head_dim"):
        return 2 * attn.n_kv_heads * attn.head_dim
    return None


def kv_bytes(model, cache, rows, slots):
    """Bytes of key/value cache for ``rows`` rows holding ``slots`` slots each
    (rotating layers hold at most their ring), or None when unknown."""
    itemsize = _compute_dtype(model).size
    total = 0
    for layer, c in zip(model.layers, cache):
        elements = _slot_elements(layer)
        if elements is None:
            return None
        held = min(slots, getattr(c, "max_size", slots))
        total += rows * held * elements * itemsize
    return total


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


def check_kv_fits(model, cache, rows, slots):
    """Raise ``ValueError`` when ``rows`` rows of ``slots`` slots cannot fit in memory."""
    need = kv_bytes(model, cache, rows, slots)
    have = available_memory()
    if need is None or have is None or need <= have:
        return
    raise ValueError(
        f"this batch needs ~{need / 1e9:.1f} GB of KV cache ({rows} rows x {slots} slots), "
        f"more than the {max(have, 0) / 1e9:.1f} GB available; lower max_tokens or the batch size"
    )
