"""Save, load and trim a model's list of per-layer caches."""

import mlx.core as mx

from .cache import KVCache, RotatingKVCache

_CACHE_CLASSES = {c.__name__: c for c in (KVCache, RotatingKVCache)}


def save_prompt_cache(file_name, cache, metadata=None):
    """Save a list of caches (and optional string metadata) to a ``.safetensors`` file."""
    arrays = {}
    for i, c in enumerate(cache):
        for j, a in enumerate(c.state):
            arrays[f"{i}.{j}"] = a
    info = {
        "classes": ",".join(type(c).__name__ for c in cache),
        "meta_states": "|".join(",".join(c.meta_state) if c.meta_state else "" for c in cache),
        "sizes": ",".join(str(c.size) for c in cache),
    }
    for k, v in (metadata or {}).items():
        info[f"user.{k}"] = str(v)
    mx.save_safetensors(file_name, arrays, metadata=info)


def load_prompt_cache(file_name, return_metadata=False):
    """Load caches written by ``save_prompt_cache``."""
    arrays, info = mx.load(file_name, return_metadata=True)
    classes = info["classes"].split(",")
    metas = info["meta_states"].split("|")
    sizes = [int(s) for s in info["sizes"].split(",")]
    cache = []
    for i, (name, meta, size) in enumerate(zip(classes, metas, sizes)):
        cls = _CACHE_CLASSES[name]
        c = cls.__new__(cls)
        KVCache.__init__(c)
        if meta:
            c.meta_state = tuple(meta.split(","))
        state = [arrays[f"{i}.{j}"] for j in range(2) if f"{i}.{j}" in arrays]
        c.state = state
        c.size = size
        cache.append(c)
    if return_metadata:
        user = {k[5:]: v for k, v in info.items() if k.startswith("user.")}
        return cache, user
    return cache


def can_trim_prompt_cache(cache):
    return all(c.is_trimmable() for c in cache)


def trim_prompt_cache(cache, num_tokens):
    if not can_trim_prompt_cache(cache) or not cache:
        return 0
    return [c.trim(num_tokens) for c in cache][0]
