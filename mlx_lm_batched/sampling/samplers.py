"""Batched sampling and logits processing (drop-in for ``mlx_lm.sample_utils``).

Every function works on a whole batch ``(B, V)`` with array ops only (no
Python loop over rows). Sampling parameters may be a scalar or one value per
row, so a continuous-batching driver can serve requests with different
settings in a single vectorised call. A 1-D ``(V,)`` input behaves like the
single-sequence mlx-lm API.
"""

import math
from typing import Callable, List, Optional, Sequence, Union

import mlx.core as mx

from .params import as_2d as _as_2d
from .params import check_rows as _check_rows
from .params import int_checker as _check_int
from .params import real_checker as _check_real
from .params import row_param as _param

Sampler = Callable[[mx.array], mx.array]
RowParam = Union[float, int, Sequence, mx.array]

_NEG_INF = -float("inf")


def _enabled(p, lo: float, hi: float) -> bool:
    """Whether a filter does anything for at least one row (mlx-lm skips it otherwise)."""
    if isinstance(p, mx.array):
        return bool(mx.any((p > lo) & (p < hi)).item())
    return lo < p < hi


# Filters: (B, V) logprobs -> (B, V) logprobs with removed tokens at -inf
def _top_k(lp: mx.array, k) -> mx.array:
    vocab = lp.shape[-1]
    if not isinstance(k, mx.array):
        if k <= 0 or k >= vocab:
            return lp
        # argpartition is O(V): after it the k most likely tokens occupy the first k slots.
        drop = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, k:]
        return mx.put_along_axis(lp, drop, mx.array(_NEG_INF, lp.dtype), axis=-1)
    # Per-row k needs each token's rank; one argsort + scatter gives it for all rows.
    order = mx.argsort(-lp, axis=-1)
    positions = mx.broadcast_to(mx.arange(vocab, dtype=mx.int32), lp.shape)
    ranks = mx.put_along_axis(mx.zeros(lp.shape, mx.int32), order, positions, axis=-1)
    keep = mx.where(k > 0, k, vocab)  # k == 0 disables the filter for that row
    return mx.where(ranks < keep, lp, _NEG_INF)


def _top_p(lp: mx.array, p) -> mx.array:
    desc = -mx.sort(-lp, axis=-1)
    probs = mx.softmax(desc.astype(mx.float32), axis=-1)
    # A token is kept while the mass of strictly more likely tokens is < p;
    # this keeps the smallest prefix reaching p (and always the top token).
    mass_before = mx.cumsum(probs, axis=-1, inclusive=False)
    n_keep = mx.maximum((mass_before < p).sum(axis=-1, keepdims=True), 1)
    threshold = mx.take_along_axis(desc, n_keep - 1, axis=-1)
    out = mx.where(lp < threshold, _NEG_INF, lp)
    if isinstance(p, mx.array):
        # mlx-lm treats top_p outside (0, 1) as "off"; do the same per row.
        out = mx.where((p > 0) & (p < 1), out, lp)
    return out


def _min_p(lp: mx.array, min_p, min_tokens_to_keep: int) -> mx.array:
    # p >= min_p * p_max  <=>  logp >= logp_max + log(min_p); log(0) = -inf keeps all.
    log_min_p = mx.log(min_p) if isinstance(min_p, mx.array) else math.log(min_p)
    remove = lp < (lp.max(axis=-1, keepdims=True) + log_min_p)
    keep_n = min(min_tokens_to_keep, lp.shape[-1])
    if keep_n > 1:
        top = mx.argpartition(-lp, kth=keep_n - 1, axis=-1)[:, :keep_n]
        remove = mx.put_along_axis(remove, top, mx.array(False), axis=-1)
    return mx.where(remove, _NEG_INF, lp)


def _xtc(lp: mx.array, probability: float, threshold: float, special: List[int], key=None):
    probs = mx.softmax(lp.astype(mx.float32), axis=-1)
    # "Exclude top choices": of the tokens above the threshold, remove all but
    # the least likely one.
    least_above = mx.where(probs > threshold, probs, mx.inf).min(axis=-1, keepdims=True)
    cut = probs > least_above
    special = [t for t in special if t < lp.shape[-1]]
    if special:
        cut[:, mx.array(special)] = False
    # One coin per row so rows stay independent (mlx-lm flips one per call).
    coin = mx.random.uniform(shape=(lp.shape[0], 1), key=key)
    return mx.where((coin < probability) & cut, _NEG_INF, lp)


def apply_top_k(logprobs: mx.array, top_k: RowParam) -> mx.array:
    """Keep only the ``top_k`` most likely tokens of each row.

    ``top_k`` is an int or one int per row; 0 (or >= vocab size) keeps all.
    """
    top_k = _param("top_k", top_k, _check_int("top_k", 0), mx.int32)
    x, squeeze = _as_2d(logprobs)
    _check_rows("top_k", top_k, x.shape[0])
    out = _top_k(x, top_k)
    return out[0] if squeeze else out


def apply_top_p(logprobs: mx.array, top_p: RowParam) -> mx.array:
    """Nucleus filter: keep the smallest set of most likely tokens with mass >= ``top_p``.

    ``top_p`` is a float or one per row; values of 0 or 1 leave a row unchanged.
    """
    top_p = _param("top_p", top_p, _check_real("top_p", 0, 1))
    x, squeeze = _as_2d(logprobs)
    _check_rows("top_p", top_p, x.shape[0])
    out = _top_p(x, top_p) if _enabled(top_p, 0, 1) else x
    return out[0] if squeeze else out


def apply_min_p(
    logprobs: mx.array, min_p: RowParam, min_tokens_to_keep: int = 1
) -> mx.array:
    """Keep tokens whose probability is at least ``min_p`` times the row's top probability.

    ``min_p`` is a float or one per row (0 keeps all); at least
    ``min_tokens_to_keep`` tokens survive in each row.
    """
    min_p = _param("min_p", min_p, _check_real("min_p", 0, 1))
    _check_int("min_tokens_to_keep", 1)(min_tokens_to_keep)
    x, squeeze = _as_2d(logprobs)
    _check_rows("min_p", min_p, x.shape[0])
    out = _min_p(x, min_p, min_tokens_to_keep) if _enabled(min_p, 0, 2) else x
    return out[0] if squeeze else out


def apply_xtc(
    logits: mx.array,
    xtc_probability: float,
    xtc_threshold: float,
    xtc_special_tokens: List[int],
) -> mx.array:
    """XTC: with probability ``xtc_probability`` (drawn per row), remove every token
    with probability above ``xtc_threshold`` except the least likely such token.
    Tokens in ``xtc_special_tokens`` are never removed."""
    _check_real("xtc_probability", 0, 1)(xtc_probability)
    _check_real("xtc_threshold", 0, 0.5)(xtc_threshold)
    special = _check_special(xtc_special_tokens)
    x, squeeze = _as_2d(logits)
    out = _xtc(x, xtc_probability, xtc_threshold, special)
    return out[0] if squeeze else out


def _check_special(tokens) -> List[int]:
    if tokens is not None and (isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__")):
        raise ValueError(f"xtc_special_tokens must be a list of token ids, got {tokens!r:.60}")
    tokens = [] if tokens is None else list(tokens)
    for t in tokens:
        _check_int("xtc_special_tokens", 0)(t)
    return tokens


# Samplers
def greedy_sampler(logprobs: mx.array) -> mx.array:
    """Argmax over the last axis: ``(B, V) -> (B,)``, ``(V,) -> ()``."""
    return mx.argmax(logprobs, axis=-1)


def _categorical(x: mx.array, temp, key=None) -> mx.array:
    if not isinstance(temp, mx.array):
        if temp == 0:
            return mx.argmax(x, axis=-1)
        return mx.random.categorical(x * (1.0 / temp), key=key)
    # Rows with temp 0 get a dummy scale (avoids inf * -inf = nan) and are
    # replaced by the argmax afterwards.
    t = temp.astype(mx.float32)
    tokens = mx.random.categorical(x * (1.0 / mx.where(t > 0, t, 1.0)), key=key)
    return mx.where(t[:, 0] > 0, tokens, mx.argmax(x, axis=-1))


def categorical_sampling(logits: mx.array, temp: RowParam) -> mx.array:
    """Sample one token per row from ``softmax(logits / temp)``.

    ``temp`` is a float or one per row; rows with ``temp == 0`` take the argmax.
    """
    temp = _param("temp", temp, _check_real("temp", 0, math.inf, finite=True))
    x, squeeze = _as_2d(logits)
    _check_rows("temp", temp, x.shape[0])
    out = _categorical(x, temp)
    return out[0] if squeeze else out


def make_sampler(
    temp: RowParam = 0.0,
    top_p: RowParam = 0.0,
    min_p: RowParam = 0.0,
    min_tokens_to_keep: int = 1,
    top_k: RowParam = 0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    xtc_special_tokens: Optional[List[int]] = None,
) -> Sampler:
    """Make a batched sampler ``sampler(logprobs) -> tokens``.

    Same signature and defaults as mlx-lm. ``logprobs`` is ``(B, V)`` (returns
    ``(B,)`` uint32) or ``(V,)`` (returns a scalar). ``temp``, ``top_p``,
    ``min_p`` and ``top_k`` may each be a scalar or one value per row; a row
    with ``temp == 0`` is greedy (argmax of the unfiltered logprobs, ignoring
    all filters as mlx-lm does), other rows apply, in mlx-lm's order,
    top-p -> min-p -> XTC -> top-k, then sample from ``softmax(x / temp)``.
    A value of 0 disables a filter (top_p of 1 too). Raises ``ValueError``
    for out-of-range values.
    """
    temp = _param("temp", temp, _check_real("temp", 0, math.inf, finite=True))
    top_p = _param("top_p", top_p, _check_real("top_p", 0, 1))
    min_p = _param("min_p", min_p, _check_real("min_p", 0, 1))
    top_k = _param("top_k", top_k, _check_int("top_k", 0), mx.int32)
    _check_int("min_tokens_to_keep", 1)(min_tokens_to_keep)
    _check_real("xtc_probability", 0, 1)(xtc_probability)
    _check_real("xtc_threshold", 0, 0.5)(xtc_threshold)
    special = _check_special(xtc_special_tokens)

    if not isinstance(temp, mx.array) and temp == 0:
        return greedy_sampler
    settings = {"temp": temp, "top_p": top_p, "min_p": min_p, "top_k": top_k,
                "min_tokens_to_keep": min_tokens_to_keep, "xtc_probability": xtc_probability,
                "xtc_threshold": xtc_threshold, "xtc_special_tokens": special}
    return BatchSampler(settings)


def make_seeded_sampler(seed: int, **settings) -> Sampler:
    """A sampler with its own random key stream, for one row: ``make_sampler(**settings)``
    whose draws come from ``mx.random.key(seed)`` split once per call.

    A row sampled with it gets the same tokens whatever else runs in its batch (its
    draws never touch the global random state). Greedy settings (``temp=0``) return
    ``greedy_sampler``. Raises ``ValueError`` for a seed outside ``[0, 2**64)``.
    """
    sampler = make_sampler(**settings)
    return sampler.seeded(seed) if isinstance(sampler, BatchSampler) else sampler


_PER_ROW = ("temp", "top_p", "min_p", "top_k")


class BatchSampler:
    """The sampler :func:`make_sampler` returns: ``sampler(logprobs) -> tokens``.

    Besides being called, it can be cut to some of its rows (:meth:`select`, for
    drivers that reorder or drop rows) and seeded (:meth:`seeded`: a copy drawing
    from its own key stream instead of the global one).
    """

    def __init__(self, settings, key=None):
        self.settings = settings
        self._key = key
        s = settings
        # Build the chain once; disabled filters cost nothing per step.
        self._steps = []
        if _enabled(s["top_p"], 0, 1):
            self._steps.append(lambda x, k: _top_p(x, s["top_p"]))
        if _enabled(s["min_p"], 0, 2):
            self._steps.append(lambda x, k: _min_p(x, s["min_p"], s["min_tokens_to_keep"]))
        if s["xtc_probability"] > 0:
            self._steps.append(lambda x, k: _xtc(x, s["xtc_probability"], s["xtc_threshold"],
                                                 s["xtc_special_tokens"], k))
        if _enabled(s["top_k"], 0, math.inf):
            self._steps.append(lambda x, k: _top_k(x, s["top_k"]))

    @property
    def rows(self) -> Optional[int]:
        """Number of per-row values it was made with (None: scalars only)."""
        counts = {self.settings[n].shape[0] for n in _PER_ROW
                  if isinstance(self.settings[n], mx.array) and self.settings[n].shape[0] > 1}
        return counts.pop() if counts else None

    def select(self, rows: Sequence[int]) -> "BatchSampler":
        """A sampler for rows ``rows`` of this one (per-row values gathered)."""
        idx = mx.array(list(rows), dtype=mx.int32)
        settings = dict(self.settings)
        for n in _PER_ROW:
            v = settings[n]
            if isinstance(v, mx.array) and v.shape[0] > 1:
                settings[n] = v[idx]
        return BatchSampler(settings, self._key)

    def seeded(self, seed: int) -> "BatchSampler":
        """A copy with its own key stream ``mx.random.key(seed)``."""
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        return BatchSampler(self.settings, mx.random.key(seed))

    def _next_key(self):
        if self._key is None:
            return None, None
        self._key, a, b = mx.random.split(self._key, 3)
        return a, b

    def next_key(self):
        """A fresh key from this sampler's own stream (None when it draws from the
        global random state): speculative decoding draws its acceptance tests with it."""
        return self._next_key()[0]

    def distribution(self, logprobs: mx.array) -> mx.array:
        """``(B, V)`` probabilities a call draws each row's token from (the filters
        and temperature applied; greedy rows one-hot at their argmax). Raises
        ``ValueError`` with XTC, whose random exclusions are no fixed distribution."""
        if self.settings["xtc_probability"] > 0:
            raise ValueError("xtc_probability > 0 cannot be combined with speculative "
                             "decoding: XTC draws are not a fixed distribution")
        lp, _ = _as_2d(logprobs)
        x = lp
        for step in self._steps:
            x = step(x, None)
        temp = self.settings["temp"]
        if not isinstance(temp, mx.array):
            return mx.softmax(x * (1.0 / temp), axis=-1)
        t = temp.astype(mx.float32)
        probs = mx.softmax(x * (1.0 / mx.where(t > 0, t, 1.0)), axis=-1)
        one_hot = mx.arange(lp.shape[-1])[None, :] == mx.argmax(lp, axis=-1)[:, None]
        return mx.where(t > 0, probs, one_hot.astype(probs.dtype))

    def __call__(self, logprobs: mx.array) -> mx.array:
        lp, squeeze = _as_2d(logprobs)
        for name in _PER_ROW:
            _check_rows(name, self.settings[name], lp.shape[0])
        draw, xtc_key = self._next_key()
        x = lp
        for step in self._steps:
            x = step(x, xtc_key)
        temp = self.settings["temp"]
        tokens = _categorical(x, temp, draw)
        if isinstance(temp, mx.array):
            # Greedy rows use the unfiltered logprobs (XTC may drop the top token).
            tokens = mx.where(temp[:, 0] > 0, tokens, mx.argmax(lp, axis=-1))
        return tokens[0] if squeeze else tokens
