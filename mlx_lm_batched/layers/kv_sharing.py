"""Key/value sharing across layers (Gemma 4, Gemma 3n): the last
``num_kv_shared_layers`` layers compute no keys or values of their own; each reads
those of the last earlier layer of its attention type.

Only the layers that own keys and values have caches (the model's cache list is
that long, as in mlx-lm) and masks; a sharing layer uses its source's mask, so its
padding and window are exactly the source's. During a forward pass the source's
cache is wrapped in a :class:`KVShare`, which keeps the keys and values the cache
returned (or, without a cache, the new ones) for the sharing layers, handed the same
:class:`KVShare` as their cache (:func:`layer_inputs` does this wiring per pass).

A model using it: ``kv_sources`` for the sources, :class:`SharedKVAttention` in the
sharing layers, ``layer_windows`` of the source layers only (so ``make_cache`` and
the masks cover those), :func:`layer_inputs` in its layer loop and
:func:`drop_shared_kv_weights` in ``sanitize``.
"""

from ..cache.kv import update_kv
from .attention import Attention
from .attention_options import Projections, Scores


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


def layer_inputs(sources, cache, masks):
    """Per layer, the ``(mask, cache)`` it runs with in one forward pass.

    ``sources``: from :func:`kv_sources`; ``cache``: one cache per source layer
    (None: a pass without caches); ``masks``: one per source layer. A layer that
    later layers read gets its cache wrapped in a fresh :class:`KVShare`, and those
    layers get the same one, with the source's mask."""
    read = {s for i, s in enumerate(sources) if s != i}
    shares, out = {}, []
    for i, s in enumerate(sources):
        if s != i:
            c = shares[s]
        else:
            c = None if cache is None else cache[i]
            if i in read:
                c = shares[i] = KVShare(c)
        out.append((masks[s], c))
    return out


def drop_shared_kv_weights(weights, sources):
    """``weights`` without the key/value projections and norms of the sharing layers
    (``model.layers.{i}.self_attn.{k,v}_{proj,norm}.*``): hub checkpoints carry unused
    ones."""
    shared = {str(i) for i, s in enumerate(sources) if s != i}
    names = ("k_proj", "v_proj", "k_norm", "v_norm")
    out = {}
    for key, value in weights.items():
        parts = key.split(".", 5)
        if (len(parts) > 4 and parts[:2] == ["model", "layers"] and parts[2] in shared
                and parts[3] == "self_attn" and parts[4] in names):
            continue
        out[key] = value
    return out


class KVShare:
    """Stands for a source layer's cache (None: a pass without cache) and keeps the
    keys and values the last update returned, for the layers that share them."""

    def __init__(self, cache=None):
        self.cache = cache
        self.kv = None

    @property
    def wants_offset(self):
        """Whether the source cache takes the rows' ``offset`` (a ring keeping sinks)."""
        return getattr(self.cache, "wants_offset", False)

    def update_and_fetch(self, keys, values, offset=None):
        self.kv = (keys, values) if self.cache is None else update_kv(self.cache, keys, values,
                                                                      offset)
        return self.kv

    def fetch(self):
        """The source layer's keys and values of this forward pass."""
        if self.kv is None:
            raise RuntimeError("a KV-sharing layer ran before its source layer")
        return self.kv


class SharedKVAttention(Attention):
    """Attention over another layer's keys and values: only queries are projected,
    normed and rotated (as :class:`~.layers.Attention` does its own); ``cache`` is
    the source's :class:`KVShare`. Parameters: ``q_proj``, the query norm,
    ``o_proj`` (tensor parallelism shards them like the source's query side)."""

    has_kv = False  # no k_proj, v_proj or key norm: checkpoints may omit them

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, rope=None, qk_norm=None,
                 projections=Projections(), scores=Scores()):
        """As :class:`~.attention.Attention`'s; ``projections`` may not name how keys and
        values are projected or normed (fused, values from keys, ``v_norm``): the
        source layer does that."""
        if isinstance(projections, Projections) and (
                projections.fused_qkv or projections.values_from_keys
                or projections.v_norm is not None):
            raise ValueError("SharedKVAttention projects queries only: no fused_qkv, "
                             "values_from_keys or v_norm")
        super().__init__(hidden_size, n_heads, n_kv_heads, head_dim, rope, qk_norm=qk_norm,
                         projections=projections, scores=scores)
        for name in ("k_proj", "v_proj", self.qk_norm_names[1]):
            if name in self:
                del self[name]

    def __call__(self, x, mask, offset, cache=None, attention=None):
        if not isinstance(cache, KVShare):
            raise TypeError("SharedKVAttention needs its source layer's KVShare as cache")
        q = self._heads(self.q_proj(x), 0, offset)
        k, v = cache.fetch()
        return self._attend(q, k, v, mask, attention)
