"""mlx-lm's ``models.cache``: the cache classes and functions code written for mlx-lm
imports from here (this package's live in ``mlx_lm_batched.cache``)."""

from ..cache.compat import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    ChunkedKVCache,
)
from ..cache.factory import make_prompt_cache
from ..cache.files import load_prompt_cache, save_prompt_cache
from ..cache.kv import KVCache
from ..cache.mlx_lm_extras import ConcatenateKVCache, LRUPromptCache, TokenBuffer, dynamic_roll
from ..cache.prompt_trie import PromptTrie, PromptTrieResult
from ..cache.prompt_cache import (
    PromptCache,
    as_prompt_cache,
    can_trim_prompt_cache,
    trim_prompt_cache,
)
from ..cache.quantized import QuantizedKVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..cache.views import RowsView, ShiftedView
from ..layers.mlx_lm_api import create_attention_mask, create_causal_mask

__all__ = [
    "ArraysCache", "BatchKVCache", "BatchRotatingKVCache", "CacheList", "ChunkedKVCache",
    "ConcatenateKVCache", "KVCache", "LRUPromptCache", "PromptCache", "PromptTrie", "PromptTrieResult",
    "QuantizedKVCache", "RotatingKVCache", "RowsView", "ShiftedView", "StateCache",
    "TokenBuffer", "as_prompt_cache", "can_trim_prompt_cache", "create_attention_mask",
    "create_causal_mask", "dynamic_roll", "load_prompt_cache", "make_prompt_cache",
    "save_prompt_cache", "trim_prompt_cache",
]

