"""mlx-lm's other cache class names: ``ArraysCache``, ``CacheList`` and ``ChunkedKVCache``
work; the batch caches, whose semantics do not match this package's (a batch here is one
set of per-layer caches holding every row, with each row's padding in the
``PromptCache``), raise on construction and name the alternative."""

from .kv import KVCache
from .state import StateCache


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


class ChunkedKVCache(KVCache):
    """mlx-lm's chunked-attention cache (Llama 4), for code that drives it itself: a
    ``KVCache`` of the tokens since ``start_position``; ``maybe_trim_front()`` drops the
    oldest so that at most ``chunk_size`` stay. ``offset`` counts every token fed.

    This package's own chunked layers (Llama 4) use a ``RotatingKVCache`` of
    ``attention_chunk_size`` slots with a chunk mask instead (``make_prompt_cache``)."""

    def __init__(self, chunk_size):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        super().__init__()
        self.chunk_size = chunk_size
        self.start_position = 0

    @property
    def offset(self):
        """Tokens fed so far (mlx-lm's ``offset``; ``size`` is the tokens held)."""
        return self.start_position + self.size

    def reset(self):
        super().reset()
        self.start_position = 0

    def maybe_trim_front(self):
        """Keep only the last ``chunk_size`` tokens (mlx-lm's)."""
        if self.keys is not None and self.size > self.chunk_size:
            trim = self.size - self.chunk_size
            self.start_position += trim
            self.drop_leading(trim)


# mlx-lm's recurrent state cache is this package's StateCache under its other name (same
# arrays, ``cache[i]``, ``filter``/``extend``/``extract``; ``ArraysCache(n, left_padding)``
# refuses padding, which a batch records in its PromptCache).
ArraysCache = StateCache


class CacheList:
    """mlx-lm's ``CacheList``: the caches of one layer that keeps several (e.g. an
    attention cache and an indexer cache), used together.

    A container for code written for mlx-lm; this package's own models keep such layers'
    caches as separate entries of one flat list, which the batch driver understands."""

    def __init__(self, *caches):
        self.caches = tuple(caches)

    def __getitem__(self, idx):
        return self.caches[idx]

    def __len__(self):
        return len(self.caches)

    def is_trimmable(self):
        return all(c.is_trimmable() for c in self.caches)

    def trim(self, n):
        """Trim every cache by ``n``; returns what the last one dropped (mlx-lm's)."""
        m = 0
        for c in self.caches:
            m = c.trim(n)
        return m

    @property
    def state(self):
        """``[(state, class name), ...]`` of the caches (mlx-lm's layout)."""
        return [(c.state, type(c).__name__) for c in self.caches]

    def filter(self, rows):
        for c in self.caches:
            c.filter(rows)

    def extend(self, other):
        """Append ``other``'s rows, cache by cache; returns each cache's
        ``(pad_self, pad_other)``."""
        if len(other) != len(self):
            raise ValueError(f"cannot extend a CacheList of {len(self)} caches with "
                             f"one of {len(other)}")
        return [c.extend(o) for c, o in zip(self.caches, other.caches)]

    def extract(self, idx):
        """Row ``idx`` of every cache (caches that have ``extract``)."""
        return CacheList(*(c.extract(idx) for c in self.caches))

    def size(self):
        return max(c.size for c in self.caches)

    @property
    def batch_size(self):
        """Rows the caches hold (0 when empty)."""
        return max((c.batch_size for c in self.caches), default=0)

    def empty(self):
        return self.caches[0].empty()

    @property
    def nbytes(self):
        return sum(c.nbytes for c in self.caches)
