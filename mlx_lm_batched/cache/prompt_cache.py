"""A batch's caches with the per-row state that outlives one call.

``PromptCache`` is what ``make_prompt_cache`` returns: a plain list of per-layer caches
to mlx-lm code (indexing, ``len``, ``cache[0].offset`` = slots held) that also keeps
each row's padding, so a padded batch can be continued by any later call, after
``save_prompt_cache``/``load_prompt_cache`` and after ``trim_prompt_cache``. Row ``b``
holds ``slots - padding[b]`` real tokens; that is the position of its next token.

Saved and loaded by ``files.py``.
"""

import mlx.core as mx

from .rewind import can_rewind_rows, rewind_rows
from .state import StateCache


class PromptCache(list):
    """The per-layer caches of one batch plus each row's padding slots.

    ``padding`` is None until rows are known (a fresh cache, or a plain list from
    mlx-lm code, whose rows are unpadded). The batch driver reads and writes it;
    models never do.
    """

    def __init__(self, caches=(), padding=None):
        super().__init__(caches)
        self.padding = None if padding is None else [int(p) for p in padding]

    @property
    def slots(self):
        """Slots every row holds (padding included)."""
        return self[0].size if len(self) else 0

    def row_padding(self, rows):
        """Padding per row for a batch of ``rows`` (zeros when never recorded)."""
        if self.padding is None:
            return [0] * rows
        if len(self.padding) != rows:
            raise ValueError(f"prompt_cache holds {len(self.padding)} rows, the prompt has {rows}")
        return list(self.padding)

    @property
    def lengths(self):
        """Real tokens per row (None until rows are known)."""
        if self.padding is None:
            return None
        return [self.slots - p for p in self.padding]

    def offsets(self, rows):
        """``(rows,)`` int32 position of each row's next token."""
        return mx.array([self.slots - p for p in self.row_padding(rows)], dtype=mx.int32)

    def add_padding(self, extra):
        """Record ``extra[b]`` more padding slots for row ``b`` (a prefill's pad columns)."""
        base = self.row_padding(len(extra))
        self.padding = [p + int(e) for p, e in zip(base, extra)]

    def reserve(self, slots):
        """Tell every layer cache to expect about ``slots`` slots (see ``KVCache.reserve``)."""
        for c in self:
            c.reserve(slots)

    def reset(self):
        """Forget every slot and row."""
        for c in self:
            c.reset()
        self.padding = None

    def filter(self, keep):
        """Keep only rows ``keep`` (indices) and drop leading padding they all share."""
        idx = mx.array(keep, dtype=mx.int32)
        padding = self.row_padding(self._rows())
        for c in self:
            c.filter(idx)
        self.padding = [padding[i] for i in keep]
        shared = min(self.padding) if self.padding else 0
        # Once a ring has wrapped its leading slots are gone already; keep the frame.
        if shared > 0 and all(c.size <= (getattr(c, "max_size", None) or c.size) for c in self):
            for c in self:
                c.drop_leading(shared)
            self.padding = [p - shared for p in self.padding]

    def extend(self, other):
        """Append the rows of ``other`` (a batch's caches for the same model)."""
        other = as_prompt_cache(other)
        if len(other) != len(self):
            raise ValueError(f"cannot extend a cache of {len(self)} layers with {len(other)}")
        if self._rows() == 0:
            self[:] = list(other)
            self.padding = other.row_padding(other._rows())
            return
        ours, theirs = self.row_padding(self._rows()), other.row_padding(other._rows())
        pads = (0, 0)
        for a, b in zip(self, other):
            pads = a.extend(b)
        self.padding = [p + pads[0] for p in ours] + [p + pads[1] for p in theirs]

    def trim(self, n):
        """Drop the last ``n`` slots of every layer (a row trimmed past its real
        tokens keeps only padding); returns how many were dropped."""
        if not can_trim_prompt_cache(self) or not len(self):
            return 0
        trimmed = [c.trim(n) for c in self][0]
        if self.padding is not None:
            self.padding = [min(p, self.slots) for p in self.padding]
        return trimmed

    def rewind_rows(self, drop):
        """Drop row ``b``'s last ``drop[b]`` tokens (rejected speculative drafts): the
        batch keeps one slot frame, each shorter row moves right and its padding grows
        (see ``cache/rewind.py``). Raises ``ValueError`` for caches that cannot."""
        stuck = sorted({type(c).__name__ for c in self if not can_rewind_rows(c)})
        if stuck:
            raise ValueError(f"speculative decoding needs caches that rewind each row; "
                             f"{', '.join(stuck)} cannot (recurrent state, or a sliding "
                             f"window already full)")
        rows = self.row_padding(len(drop))
        if any(d < 0 or d > self.slots - p for d, p in zip(drop, rows)):
            raise ValueError(f"cannot drop {list(drop)} tokens from rows holding "
                             f"{[self.slots - p for p in rows]}")
        shift = [0] * len(drop)
        for c in self:
            shift = rewind_rows(c, drop)
        self.padding = [p + s for p, s in zip(rows, shift)]

    def _rows(self):
        if self.padding is not None:
            return len(self.padding)
        return next((n for n in (batch_rows(c) for c in self) if n), 0)

    @property
    def nbytes(self):
        return sum(c.nbytes for c in self)


def batch_rows(c):
    """Rows a layer cache holds (0 when empty)."""
    return c.batch_size


def as_prompt_cache(cache):
    """``cache`` itself when it is a ``PromptCache``, else a ``PromptCache`` of the
    same layer caches: rows unpadded (mlx-lm style plain lists), or padded as the
    first layer's ``left_padding`` says (mlx-lm's ``BatchKVCache`` list)."""
    if isinstance(cache, PromptCache):
        return cache
    padding = getattr(cache[0], "left_padding", None) if len(cache) else None
    return PromptCache(cache, None if padding is None else padding.tolist())


def cache_offsets(cache, rows):
    """Position of each row's next token for a model called without ``offset``:
    a ``PromptCache`` knows its rows' padding; a plain list holds unpadded rows."""
    if cache is None or not len(cache) or cache[0] is None:
        return mx.zeros((rows,), dtype=mx.int32)
    return as_prompt_cache(cache).offsets(rows)


def can_trim_prompt_cache(cache):
    """True when every layer cache can drop its last slots."""
    return all(c.is_trimmable() for c in cache)


def trim_prompt_cache(cache, num_tokens):
    """Drop the last ``num_tokens`` slots of every layer (and keep a ``PromptCache``'s
    row padding consistent); returns how many were dropped."""
    if isinstance(cache, PromptCache):
        return cache.trim(num_tokens)
    if not can_trim_prompt_cache(cache) or not cache:
        return 0
    return [c.trim(num_tokens) for c in cache][0]
