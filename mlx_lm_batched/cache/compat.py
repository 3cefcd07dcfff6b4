"""mlx-lm's per-layer cache methods that this package's own code does not call.

``MlxLmCacheMethods`` is mixed into the key/value caches (``KVCache``, its ring
``RotatingKVCache``, ``QuantizedKVCache``) so that code written for mlx-lm finds the
methods it calls on them; each is a view of what the cache holds, never a second copy
of its state.

``to_quantized`` builds a ``QuantizedKVCache``, which is made of float caches: the
quantized class cannot be imported here without an import cycle, so it declares itself
(``class QuantizedKVCache(MlxLmCacheMethods, quantized_form=True)``) and this base
keeps that one class.
"""


class MlxLmCacheMethods:
    """mlx-lm's ``keys_and_values()`` and ``to_quantized()`` on a cache that has
    ``ordered()``."""

    _quantized_form = None  # QuantizedKVCache (cache/quantized.py) once defined

    def __init_subclass__(cls, quantized_form=False, **kwargs):
        super().__init_subclass__(**kwargs)
        if quantized_form:
            MlxLmCacheMethods._quantized_form = cls

    def to_quantized(self, group_size=64, bits=4):
        """mlx-lm's method: a ``QuantizedKVCache`` holding this cache's slots quantized
        (``cache.quantized.to_quantized``; rings quantize too, where mlx-lm refuses)."""
        form = MlxLmCacheMethods._quantized_form
        if form is None:
            raise RuntimeError("to_quantized needs mlx_lm_batched.cache.quantized imported")
        return form.of(self, group_size, bits)

    def keys_and_values(self):
        """The held keys and values in time order (mlx-lm's rotating cache returns its
        ring order instead; quantized caches return their ``(packed, scales, biases)``
        triples)."""
        if self.empty():
            raise ValueError(f"{type(self).__name__}.keys_and_values: the cache is empty")
        return self.ordered()
