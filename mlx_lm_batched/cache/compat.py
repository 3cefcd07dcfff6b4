"""mlx-lm's per-layer cache methods that this package's own code does not call.

``MlxLmCacheMethods`` is mixed into the key/value caches (``KVCache``, its ring
``RotatingKVCache``, ``QuantizedKVCache``) so that code written for mlx-lm finds the
methods it calls on them; each is a view of what the cache holds, never a second copy
of its state.
"""


class MlxLmCacheMethods:
    """mlx-lm's ``keys_and_values()`` on a cache that has ``ordered()``."""

    def keys_and_values(self):
        """The held keys and values in time order (mlx-lm's rotating cache returns its
        ring order instead; quantized caches return their ``(packed, scales, biases)``
        triples)."""
        if self.empty():
            raise ValueError(f"{type(self).__name__}.keys_and_values: the cache is empty")
        return self.ordered()
