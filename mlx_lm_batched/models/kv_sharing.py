"""Key/value sharing across layers (Gemma 4, Gemma 3n): the last
``num_kv_shared_layers`` layers compute no keys or values of their own; each reads
those of the last earlier layer of its attention type.

Only the layers that own keys and values have caches (the model's cache list is
that long, as in mlx-lm) and masks; a sharing layer uses its source's mask, so its
padding and window are exactly the source's. During a forward pass the source's
cache is wrapped in a :class:`KVShare`, which keeps the keys and values the cache
returned (or, without a cache, the new ones) for the sharing layers, handed the same
:class:`KVShare` as their cache.
"""

from .layers import Attention


def kv_sources(layer_types, num_shared):
    """Per layer, the index of the layer whose keys and values it attends over: itself
    for the first ``len(layer_types) - num_shared`` layers, else the last of those
    with its attention type (Hugging Face's ``kv_sharing_modes``)."""
    n = len(layer_types)
    owners = n - num_shared
    if not 0 <= num_shared < n:
        raise ValueError(f"num_kv_shared_layers must be in [0, {n - 1}] for {n} layers, "
                         f"got {num_shared}")
    last = {t: i for i, t in enumerate(layer_types[:owners])}
    sources = list(range(owners))
    for i in range(owners, n):
        if layer_types[i] not in last:
            raise ValueError(f"layer {i} ({layer_types[i]}) shares keys and values, but no "
                             f"earlier layer of that type computes them")
        sources.append(last[layer_types[i]])
    return sources


class KVShare:
    """Stands for a source layer's cache (None: a pass without cache) and keeps the
    keys and values the last update returned, for the layers that share them."""

    def __init__(self, cache=None):
        self.cache = cache
        self.kv = None

    def update_and_fetch(self, keys, values):
        self.kv = (keys, values) if self.cache is None else self.cache.update_and_fetch(keys, values)
        return self.kv

    def fetch(self):
        """The source layer's keys and values of this forward pass."""
        if self.kv is None:
            raise RuntimeError("a KV-sharing layer ran before its source layer")
        return self.kv


class SharedKVAttention(Attention):
    """Attention over another layer's keys and values: only queries are projected,
    normed (per head, before RoPE) and rotated; ``cache`` is the source's
    :class:`KVShare`. Parameters: ``q_proj``, the query norm, ``o_proj``."""

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, rope=None, bias=False,
                 scale=None, qk_norm=None, qk_norm_names=("q_norm", "k_norm")):
        super().__init__(hidden_size, n_heads, n_kv_heads, head_dim, rope, bias=bias, scale=scale,
                         qk_norm=qk_norm, qk_norm_names=qk_norm_names)
        for name in ("k_proj", "v_proj", qk_norm_names[1]):
            if name in self:
                del self[name]

    def __call__(self, x, mask, offset, cache=None, attention=None):
        if not isinstance(cache, KVShare):
            raise TypeError("SharedKVAttention needs its source layer's KVShare as cache")
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.n_heads, -1)
        if self.has_qk_norm:
            q = getattr(self, self.qk_norm_names[0])(q)
        q = q.transpose(0, 2, 1, 3)
        if self.rope is not None:
            q = self.rope(q, offset)
        k, v = cache.fetch()
        return self._attend(q, k, v, mask, attention)
