"""Caches of a batch (mlx-lm's module name): the per-layer key/value caches
(``kv_cache.py``), the ``PromptCache`` that holds them with each row's padding, and
saving, loading and trimming it (``prompt_cache.py``)."""

from .cache_views import RowsView, ShiftedView  # noqa: F401
from .kv_cache import KVCache, RotatingKVCache  # noqa: F401
from .state_cache import StateCache  # noqa: F401
from .prompt_cache import (  # noqa: F401
    PromptCache,
    as_prompt_cache,
    can_trim_prompt_cache,
    load_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)


def make_prompt_cache(model, max_kv_size=None):
    """A :class:`PromptCache` of one cache per layer: the model's own layout when it
    has one, else full caches (or rotating caches of ``max_kv_size`` slots when given)."""
    if hasattr(model, "make_cache"):
        try:
            caches = model.make_cache(max_kv_size=max_kv_size)
        except TypeError:
            caches = model.make_cache()
    else:
        n = len(model.layers)
        if max_kv_size is not None:
            caches = [RotatingKVCache(max_size=max_kv_size) for _ in range(n)]
        else:
            caches = [KVCache() for _ in range(n)]
    return PromptCache(caches)
