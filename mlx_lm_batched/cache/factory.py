"""``make_prompt_cache``: the caches of a model, as one ``PromptCache``."""

import inspect

from .kv import KVCache
from .prompt_cache import PromptCache
from .rotating import max_kv_cache


def make_prompt_cache(model, max_kv_size=None):
    """A :class:`PromptCache` of one cache per layer: the model's own layout when it
    has one, else full caches (or, with ``max_kv_size``, rotating caches of that many
    slots that keep each row's first 4 tokens, as mlx-lm's)."""
    make_cache = getattr(model, "make_cache", None)
    if make_cache is not None:
        # mlx-lm's models take no max_kv_size; ours may (asked by signature, so a
        # TypeError raised inside a model's make_cache is not mistaken for it).
        takes_size = "max_kv_size" in inspect.signature(make_cache).parameters
        caches = make_cache(max_kv_size=max_kv_size) if takes_size else make_cache()
    else:
        n = len(model.layers)
        if max_kv_size is not None:
            caches = [max_kv_cache(max_kv_size) for _ in range(n)]
        else:
            caches = [KVCache() for _ in range(n)]
    return PromptCache(caches)
