"""Prefix reuse: an LRU store of prompt caches keyed by their token sequences.

A serving loop keeps the caches of finished requests here; a new request asks for
the longest cached prefix of its prompt and only prefills the rest. This is what
mlx-lm's server calls ``LRUPromptCache`` (same method names), written for batched
rows: every stored cache holds ONE row, unpadded.

Differences from mlx-lm's, on purpose:
- ``fetch_nearest_cache`` always leaves at least one prompt token to process (the
  model needs one input to give the next token's logits), so its result can be
  passed straight to ``BatchGenerator.insert``; an exact hit comes back trimmed by one
  token when the cache can be trimmed.
- Stored caches are compacted to the slots they hold, so the byte bound counts what
  is really kept (a live cache reserves room for tokens it never generated).
"""

import copy
from collections import OrderedDict

import mlx.core as mx
import numpy as np

from ..cache.prompt_cache import can_trim_prompt_cache, trim_prompt_cache

CACHE_TYPES = ("assistant", "user", "system")  # eviction order: assistant turns go first


def _model_key(model, adapter=0):
    """Entries are per model and adapter slot (``layers.lora``: the same tokens give other
    keys and values under another adapter); ``nn.Module`` is a dict (unhashable), so key
    by identity."""
    try:
        hash(model)
        key = model
    except TypeError:
        key = ("id", id(model))
    return key if not adapter else (key, "adapter", int(adapter))


def _common_prefix(a, b):
    """Length of the common prefix of two int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def cache_nbytes(prompt_cache):
    """Bytes held by a list of per-layer caches."""
    return sum(getattr(c, "nbytes", 0) for c in prompt_cache)


def _contiguous(x):
    # Quantized caches hold (packed, scales, biases) triples.
    return tuple(map(mx.contiguous, x)) if isinstance(x, tuple) else mx.contiguous(x)


def compact(prompt_cache):
    """Drop the unused capacity of each layer cache (in place); returns the cache."""
    for c in prompt_cache:
        keys, values = c.ordered()
        if keys is not None:
            c.load_ordered(_contiguous(keys), _contiguous(values), c.size)
    mx.eval([c.state for c in prompt_cache])
    return prompt_cache


class LRUPromptCache:
    """Prompt caches by token prefix, bounded in entries and bytes, least recently used out.

    ``insert_cache(model, tokens, cache)`` stores the cache of ``tokens`` (it is
    compacted and owned by the store from then on); ``fetch_nearest_cache(model,
    tokens)`` returns ``(a copy of the cache of the longest usable prefix, the tokens
    still to process)`` or ``(None, tokens)``.
    """

    def __init__(self, max_size=10, max_bytes=1 << 63):
        if max_size < 0 or max_bytes < 0:
            raise ValueError("LRUPromptCache: max_size and max_bytes must be >= 0")
        self.max_size = max_size
        self.max_bytes = max_bytes
        self._entries = OrderedDict()  # (model key, tokens tuple) -> (tokens array, cache, nbytes, type)
        self._nbytes = 0

    def __len__(self):
        return len(self._entries)

    @property
    def nbytes(self):
        return self._nbytes

    def _candidates(self, key, tokens):
        """(common prefix, entry key, entry) for every entry of this model, best first."""
        found = []
        for k, entry in self._entries.items():
            if k[0] == key:
                found.append((_common_prefix(entry[0], tokens), k, entry))
        return found

    def fetch_nearest_cache(self, model, tokens, adapter=0):
        """A copy of the cache covering the longest prefix of ``tokens``, and the rest.

        At least one token is always left to process. Returns ``(None, tokens)`` when
        nothing useful is cached. A hit counts as a use for the LRU order.
        """
        tokens = list(tokens)
        if not tokens:
            raise ValueError("fetch_nearest_cache: empty token list")
        query = np.asarray(tokens, dtype=np.int64)
        limit = len(tokens) - 1  # tokens a cache may cover
        best = None  # (usable prefix, entry key, entry, trim)
        for common, k, entry in self._candidates(_model_key(model, adapter), query):
            stored = len(entry[0])
            if stored == common and stored <= limit:
                usable, trim = stored, 0  # the entry is a prefix of the prompt
            elif can_trim_prompt_cache(entry[1]):
                usable = min(common, limit)
                trim = stored - usable
            else:
                continue  # diverges (or covers the whole prompt) but cannot be cut back
            if usable > 0 and (best is None or usable > best[0]):
                best = (usable, k, entry, trim)
        if best is None:
            return None, tokens
        usable, k, entry, trim = best
        self._entries.move_to_end(k)
        cache = copy.deepcopy(entry[1])
        if trim:
            trim_prompt_cache(cache, trim)
        return cache, tokens[usable:]

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type="assistant", adapter=0):
        """Store ``prompt_cache`` (one row) as the cache of ``tokens``; evict to the bounds.

        A trimmable cache makes its stored prefixes redundant: they are dropped.
        """
        if cache_type not in CACHE_TYPES:
            raise ValueError(f"cache_type must be one of {CACHE_TYPES}, got {cache_type!r}")
        key = _model_key(model, adapter)
        tokens = tuple(int(t) for t in tokens)
        compact(prompt_cache)
        k = (key, tokens)
        if k in self._entries:
            self._drop(k)
        if can_trim_prompt_cache(prompt_cache):
            for other in [o for o in self._entries if o[0] == key and len(o[1]) < len(tokens)
                          and tokens[: len(o[1])] == o[1]]:
                self._drop(other)
        nbytes = cache_nbytes(prompt_cache)
        self._entries[k] = (np.asarray(tokens, dtype=np.int64), prompt_cache, nbytes, cache_type)
        self._nbytes += nbytes
        self.trim_to(n_sequences=self.max_size, n_bytes=self.max_bytes)

    def _drop(self, k):
        entry = self._entries.pop(k)
        self._nbytes -= entry[2]

    def _evict_one(self):
        # Oldest entry of the first type (assistant, user, system) that has any.
        for kind in CACHE_TYPES:
            for k, entry in self._entries.items():
                if entry[3] == kind:
                    self._drop(k)
                    return

    def trim_to(self, *, n_sequences=None, n_bytes=None):
        """Evict least recently used entries until both bounds hold."""
        n_sequences = (1 << 63) if n_sequences is None else max(0, n_sequences)
        n_bytes = (1 << 63) if n_bytes is None else max(0, n_bytes)
        while self._entries and (len(self._entries) > n_sequences or self._nbytes > n_bytes):
            self._evict_one()

    def park(self, model, tokens, cache, adapter=0):
        """Keep a preempted row's ``cache`` of ``tokens`` (as an entry) for :meth:`unpark`."""
        self.insert_cache(model, list(tokens), cache, adapter=adapter)

    def unpark(self, model, parked, tokens, adapter=0):
        """``(cache, tokens it holds)`` to resume a row whose tokens are now ``tokens``:
        the nearest entry (the parked one, unless evicted), or ``(None, 0)``."""
        cache, rest = self.fetch_nearest_cache(model, tokens, adapter)
        return cache, len(tokens) - len(rest)

    def hold(self, uid, cache):
        """Row ``uid`` was inserted with ``cache``: nothing to pin (a fetch is a copy)."""

    def release(self, uid):
        """Row ``uid`` left: nothing to unpin."""

    def reused_tokens(self, prompt, adapter=0):
        """0: a fetch here is a copy, the row's own memory."""
        return 0

    def close(self):
        """Server shutdown: nothing to write (the LRU lives in memory only)."""

    def gauges(self):
        """Extra metrics gauges (the block store's; none here)."""
        return {}

    def describe(self):
        """One line for the startup log."""
        return (f"whole-cache LRU of {self.max_size} entries, {len(self)} held, "
                f"{self._nbytes} bytes of {self.max_bytes}")

    def stats_by_type(self):
        """``{cache_type: {"n_sequences": int, "n_bytes": int}}``."""
        out = {kind: {"n_sequences": 0, "n_bytes": 0} for kind in CACHE_TYPES}
        for entry in self._entries.values():
            out[entry[3]]["n_sequences"] += 1
            out[entry[3]]["n_bytes"] += entry[2]
        return out
