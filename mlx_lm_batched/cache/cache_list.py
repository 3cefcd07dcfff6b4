"""mlx-lm's ``CacheList``: one layer's several caches used together, for code written for
mlx-lm and for prompt-cache files written by it (``cache/files.py``)."""


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
