"""mlx-lm's other cache class names, with what to use instead.

Their semantics do not match this package's (a batch here is one set of per-layer caches
holding every row, with each row's padding in the ``PromptCache``), so constructing one
raises and names the alternative."""


class _Unsupported:
    alternative = ""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} is not supported by mlx_lm_batched: "
                                  f"{self.alternative}")


class BatchKVCache(_Unsupported):
    """Not supported (mlx-lm's per-layer batch cache with left padding)."""

    alternative = ("every KVCache holds a whole batch; use make_prompt_cache(model) (or "
                   "PromptCache(caches, padding=left_padding)) and let batch_generate, "
                   "generate_step or BatchGenerator record each row's padding")


class BatchRotatingKVCache(_Unsupported):
    """Not supported (mlx-lm's rotating batch cache)."""

    alternative = ("every RotatingKVCache holds a whole batch; use "
                   "make_prompt_cache(model, max_kv_size=N)")


class ChunkedKVCache(_Unsupported):
    """Not supported (mlx-lm's chunked attention cache, Llama 4)."""

    alternative = ("chunked-attention layers (Llama 4) use a RotatingKVCache of "
                   "attention_chunk_size slots with a chunk mask; use make_prompt_cache(model)")


class ArraysCache(_Unsupported):
    """Not supported by this name (mlx-lm's recurrent state cache with its own padding)."""

    alternative = ("recurrent (SSM / linear attention) state lives in StateCache, whose "
                   "rows' padding the PromptCache records; use make_prompt_cache(model)")


class CacheList(_Unsupported):
    """Not supported (several caches grouped as one)."""

    alternative = ("a model's caches here are one flat list (a layer with two keeps two "
                   "entries); use make_prompt_cache(model)")
