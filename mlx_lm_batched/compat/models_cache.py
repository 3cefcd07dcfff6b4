"""The names of mlx-lm's ``models.cache`` that exist only for code written for mlx-lm:
``ConcatenateKVCache``, ``dynamic_roll`` and ``TokenBuffer``; and the names that raise on
construction and name the alternative: ``BatchRotatingKVCache``, whose semantics do not
match this package's (a batch here is one set of per-layer caches holding every row, with
each row's padding in the ``PromptCache``; mlx-lm's ``BatchKVCache`` is
``cache/batch_kv.py``)."""

import mlx.core as mx

from ..cache.kv import KVCache


class ConcatenateKVCache(KVCache):
    """mlx-lm's simplest KV cache (it concatenates on every update). Here it is a
    ``KVCache``: the same keys, values, offset and state after each update; only the
    buffer growth differs, which no result depends on."""


def dynamic_roll(x, shifts, axis):
    """Roll ``x`` along ``axis`` by a different amount per leading index: ``shifts`` has
    the shape of ``x``'s axes before ``axis``; element ``i`` moves to ``(i + shift) % n``."""
    n = x.shape[axis]
    lead = shifts.reshape(shifts.shape + (1,) * (x.ndim - shifts.ndim))
    positions = mx.arange(n).reshape((n,) + (1,) * (x.ndim - axis - 1))
    idx = (positions - lead) % n
    return mx.take_along_axis(x, idx, axis=axis)


class TokenBuffer:
    """A growing ``int32`` token array (mlx-lm's): ``update_and_fetch`` appends and
    returns every token so far; the buffer grows in ``step``-sized blocks."""

    step = 256

    def __init__(self, tokens=None):
        tokens = [] if tokens is None else tokens
        self._buffer = mx.array(tokens, dtype=mx.int32)
        self._size = len(tokens)

    def update_and_fetch(self, tokens):
        """Append ``tokens`` (a list or 1-D array); return all tokens held."""
        end = self._size + len(tokens)
        capacity = -(-end // self.step) * self.step
        if capacity > self._buffer.size:
            grow = mx.zeros((capacity - self._buffer.size,), mx.int32)
            self._buffer = mx.concatenate([self._buffer, grow])
        self._buffer[self._size:end] = mx.array(tokens, mx.int32)
        self._size = end
        return self._buffer[:end]

    @property
    def state(self):
        """The whole buffer, unused tail included (mlx-lm's ``state``)."""
        return self._buffer

    @property
    def tokens(self):
        """The tokens held."""
        return self._buffer[: self._size]


class _Unsupported:
    alternative = ""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} is not supported by mlx_lm_batched: "
                                  f"{self.alternative}")


class BatchRotatingKVCache(_Unsupported):
    """Not supported (mlx-lm's rotating batch cache)."""

    alternative = ("every RotatingKVCache holds a whole batch; use "
                   "make_prompt_cache(model, max_kv_size=N)")
