"""mlx-lm's chunked-attention cache (``ChunkedKVCache``, Llama 4's), for code that drives
it itself and for prompt-cache files written by mlx-lm (``cache/files.py``)."""

from .kv import KVCache


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
