"""mlx-lm's ``LRUPromptCache`` (``mlx_lm.server`` / ``mlx_lm.models.cache``), with its
semantics, for code written against it.

It stores any per-layer cache objects that have mlx-lm's protocol (``nbytes``,
``is_trimmable()``, ``trim(n)``) under ``(model, token sequence)`` in a
:class:`~.prompt_trie.PromptTrie`; ``fetch_nearest_cache`` answers with a deep copy of
the exact entry (and no token left), of a longer entry cut back to the common prefix
(when it can be trimmed), or of the longest stored prefix. Eviction takes the oldest
entry of the first cache type (assistant, user, system) that holds at least as many
entries as the next one; a fetch does not refresh an entry.

This package's server uses its own store (``sched/prefix_cache.py``: an exact hit leaves
one token to prefill, stored caches are compacted, entries per adapter); this class
exists only under mlx-lm's names.
"""

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any, List

from .prompt_cache import can_trim_prompt_cache, trim_prompt_cache
from .prompt_trie import PromptTrie

CACHE_TYPES = ("assistant", "user", "system")


@dataclass
class _Entry:
    prompt_cache: List[Any]
    nbytes: int
    cache_type: str


class _EvictionOrder:
    """Insertion order per cache type; ``pop`` picks the victim as mlx-lm does."""

    def __init__(self):
        self.queues = {kind: deque() for kind in CACHE_TYPES}

    def __len__(self):
        return sum(len(q) for q in self.queues.values())

    def push(self, key, cache_type):
        self.queues[cache_type].append(key)

    def remove(self, key):
        for q in self.queues.values():
            if key in q:
                q.remove(key)
                return

    def pop(self):
        """The oldest key of the first type holding at least as many as the next type
        (the last type when none does)."""
        for kind, following in zip(CACHE_TYPES, CACHE_TYPES[1:]):
            q = self.queues[kind]
            if q and len(q) >= len(self.queues[following]):
                return q.popleft()
        return self.queues[CACHE_TYPES[-1]].popleft()


class MlxLmLRUPromptCache:
    """mlx-lm's prompt-cache store (see the module docstring), bounded by ``max_size``
    entries (checked once per insert, as mlx-lm does) and ``max_bytes``."""

    def __init__(self, max_size=10, max_bytes=1 << 63):
        self.max_size = max_size
        self.max_bytes = max_bytes
        self._trie = PromptTrie()
        self._order = _EvictionOrder()
        self._nbytes = 0
        self._nbytes_by_type = {kind: 0 for kind in CACHE_TYPES}

    def __len__(self):
        return len(self._order)

    @property
    def nbytes(self):
        """Bytes of every stored cache (their ``nbytes`` when inserted)."""
        return self._nbytes

    def fetch_nearest_cache(self, model, tokens):
        """``(a copy of the best cache, the tokens it does not cover)``, or
        ``(None, tokens)``: an exact entry leaves ``[]``; a longer trimmable entry is cut
        back to the common prefix (at most ``len(tokens) - 1``) when that beats the
        longest stored prefix."""
        found = self._trie.search(model, tokens)
        if found.exact is not None:
            return copy.deepcopy(self._trie.get(model, found.exact).prompt_cache), []
        shorter = len(found.shorter) if found.shorter is not None else 0
        if found.longer is not None and found.common_prefix > shorter:
            entry = self._trie.get(model, found.longer)
            if can_trim_prompt_cache(entry.prompt_cache):
                cache = copy.deepcopy(entry.prompt_cache)
                keep = min(len(tokens) - 1, found.common_prefix)
                trim_prompt_cache(cache, len(found.longer) - keep)
                return cache, tokens[keep:]
        if shorter:
            return copy.deepcopy(self._trie.get(model, found.shorter).prompt_cache), \
                tokens[shorter:]
        return None, tokens

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type="assistant"):
        """Store ``prompt_cache`` (held, not copied) under ``tokens``; a trimmable cache
        replaces the entries stored under its prefixes; then evict to the bounds."""
        if cache_type not in CACHE_TYPES:
            raise ValueError(f"cache_type must be one of {CACHE_TYPES}, got {cache_type!r}")
        entry = _Entry(prompt_cache, sum(c.nbytes for c in prompt_cache), cache_type)
        self._count(entry, +1)
        previous = self._trie.add(model, tokens, entry)
        if previous is not None:
            self._count(previous, -1)
            self._order.remove((model, tokens))
        self._order.push((model, tokens), cache_type)
        if can_trim_prompt_cache(prompt_cache):
            for length, dropped in self._trie.pop_prefixes(model, tokens):
                self._count(dropped, -1)
                self._order.remove((model, tokens[:length]))
        if len(self._order) > self.max_size:
            self._evict()
        while self._nbytes > self.max_bytes:
            self._evict()

    def trim_to(self, *, n_sequences=None, n_bytes=None):
        """Evict until at most ``n_sequences`` entries and ``n_bytes`` bytes are held."""
        n_sequences = (1 << 63) if n_sequences is None else max(0, n_sequences)
        n_bytes = (1 << 63) if n_bytes is None else max(0, n_bytes)
        while len(self._order) > n_sequences:
            self._evict()
        while self._nbytes > n_bytes:
            self._evict()

    def stats_by_type(self):
        """``{cache_type: {"n_sequences": int, "n_bytes": int}}``."""
        return {kind: {"n_sequences": len(self._order.queues[kind]),
                       "n_bytes": self._nbytes_by_type[kind]} for kind in CACHE_TYPES}

    def _count(self, entry, sign):
        self._nbytes += sign * entry.nbytes
        self._nbytes_by_type[entry.cache_type] += sign * entry.nbytes

    def _evict(self):
        model, tokens = self._order.pop()
        self._count(self._trie.pop(model, tokens), -1)
