"""The batch driver: it alone owns each row's padding and position.

A ``BatchEngine`` runs one left-padded batch through a model: chunked prefill, then
one decode step at a time. Each row's padding lives with the batch's caches (the
``PromptCache``), so a later call on the same caches continues every row exactly;
the engine reads it to hand the model each row's position (``offset``) and any
per-step attention data, and records what a prefill adds. Rows can be dropped
(``filter``) so finished rows stop costing compute.
"""

import mlx.core as mx

from .kv_budget import check_kv_fits, model_context
from .models.base import StepAttention
from .models.cache import KVCache, ShiftedView, as_prompt_cache, make_prompt_cache
from .models.cache_views import has_rows_view, rows_view
from .sample_utils import greedy_sampler

PAD_ID = -1  # marks padding in token histories given to logits processors

# Prefill groups (see ``plan_prefill_groups``). Each forward call reads every weight
# once, so a call costs about as much as this many extra tokens; a group never
# exceeds the token budget (bounds activation memory) unless it is a single row.
# On the CPU small groups are also faster (activations stay in cache) and keep the
# prefill's transient memory to a few tens of MB; accelerators prefer big calls.
GROUP_OVERHEAD_TOKENS = 64
GROUP_TOKEN_BUDGET = 4096
GROUP_TOKEN_BUDGET_CPU = 512
# Decode attention groups (see ``BatchEngine._plan_decode_groups``): on the CPU one
# more group costs about as much as attending this many extra (row, key) pairs.
DECODE_GROUP_OVERHEAD_KEYS = 256


def left_pad(prompts, pad_id=0):
    """``(B, L)`` array of left-padded prompts and the ``(B,)`` padding per row."""
    width = max(len(p) for p in prompts)
    padding = [width - len(p) for p in prompts]
    rows = [[pad_id] * n + [int(t) for t in p] for n, p in zip(padding, prompts)]
    return mx.array(rows, dtype=mx.int32), padding


def plan_prefill_groups(lengths, overhead=None, budget=None):
    """Split rows into contiguous ``(start, stop)`` groups for prefill.

    ``lengths[b]`` is the number of real tokens row ``b`` prefills. A group runs
    left-padded to its longest row, so it costs ``rows * longest`` tokens plus a
    fixed ``overhead`` per call; this picks the split of least total cost (dynamic
    programming over the row order, which ``batch_generate`` sorts by length).
    Groups of rows with nothing to prefill cost nothing and are still returned.
    """
    overhead = GROUP_OVERHEAD_TOKENS if overhead is None else overhead
    if budget is None:
        cpu = mx.default_device() == mx.cpu
        budget = GROUP_TOKEN_BUDGET_CPU if cpu else GROUP_TOKEN_BUDGET
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for stop in range(1, n + 1):
        longest = 0
        for start in range(stop - 1, -1, -1):
            longest = max(longest, lengths[start])
            rows = stop - start
            if rows > 1 and rows * longest > budget:
                break  # adding rows only grows the group
            cost = best[start] + rows * longest + (overhead if longest else 0)
            if cost < best[stop]:
                best[stop], cut[stop] = cost, start
    groups, stop = [], n
    while stop > 0:
        groups.append((cut[stop], stop))
        stop = cut[stop]
    return groups[::-1]


class BatchEngine:
    """Prefill and decode one batch of rows that share a cache.

    ``prompt_cache``: the batch's caches (``make_prompt_cache``; a plain list of
    layer caches counts as unpadded rows), new ones when None. Its rows' padding is
    the one record of each row's position: ``offset`` and ``left_padding`` read it.
    """

    def __init__(
        self,
        model,
        sampler=None,
        logits_processors=None,
        prompt_cache=None,
        max_kv_size=None,
        prefill_step_size=2048,
    ):
        self.model = model
        self.sampler = sampler or greedy_sampler
        self.logits_processors = list(logits_processors or [])
        if prompt_cache is None:
            prompt_cache = make_prompt_cache(model, max_kv_size)
        self.cache = as_prompt_cache(prompt_cache)
        self.prefill_step_size = max(1, int(prefill_step_size))
        self.history = None  # (B, T) tokens so far, PAD_ID for padding (processors only)
        self.decode_reserve = 0  # expected decode steps (sizes the caches)
        # False: the default greedy sampler skips the log-softmax over the vocabulary
        # and ``step`` returns None logprobs (batch_generate without logprobs).
        self.want_logprobs = True
        self._decode_groups = None  # decode attention row groups (``_plan_decode_groups``)
        self._plan_decode_groups()

    def reserve(self, new_tokens):
        """Expect about ``new_tokens`` decode steps. The caches reserve at most a
        bounded step ahead of what they hold (see ``KVCache.reserve``), and the
        next prefill checks that the batch's caches can fit at their longest."""
        self.decode_reserve = max(0, int(new_tokens))

    @property
    def slots(self):
        return self.cache.slots

    @property
    def offset(self):
        """``(B,)`` real tokens per row in the cache (None before any row)."""
        padding = self.cache.padding
        return None if padding is None else self.cache.offsets(len(padding))

    @property
    def left_padding(self):
        """``(B,)`` pad slots per row: every row fills the same number of slots."""
        padding = self.cache.padding
        return None if padding is None else mx.array(padding, dtype=mx.int32)

    def _reserve(self, rows, slots):
        """Check and reserve memory for ``rows`` rows reaching ``slots`` + the expected
        decode steps (at most the model's context)."""
        ahead = self.decode_reserve
        context = model_context(self.model)
        if context is not None:
            ahead = min(ahead, context)
        check_kv_fits(self.model, self.cache, rows, slots + ahead)
        self.cache.reserve(slots + ahead)

    def prefill(self, tokens, left_padding=None, progress=None, input_embeddings=None):
        """Feed the ``(B, L)`` prompt; return the queued ``(tokens, logprobs)`` of step one.

        ``left_padding[b]``: pad columns before row ``b``'s tokens. On caches that
        already hold rows (a later turn), each row's new tokens follow its cached
        ones directly and its pad columns join its leading padding.

        All columns but the last go through the model in chunks whose logits are
        never computed (only the caches are evaluated); into fresh caches with row
        views (``has_rows_view``: full key/value, recurrent state, rings the prompt
        does not wrap) they go group by group (``_prefill_groups``). The last column,
        for all rows at once, gives the first sampled token.
        """
        B, L = tokens.shape
        if L == 0:
            raise ValueError("empty prompt: nothing to generate from")
        pad = [0] * B if left_padding is None else [int(p) for p in left_padding]
        if len(pad) != B or any(p < 0 or p >= L for p in pad):
            raise ValueError(f"left_padding must give 0 <= padding < {L} for each of the "
                             f"{B} rows, got {pad}")
        if self.slots == 0:
            self.cache.reset()  # no slots: no rows either, whatever was there before
        start = self.slots
        before = self.cache.offsets(B)  # real tokens per row (checks the row count)
        self._reserve(B, start + L)
        if self.logits_processors:
            cols = mx.arange(L)[None, :]
            hist = mx.where(cols < mx.array(pad)[:, None], PAD_ID, tokens)
            self.history = hist if self.history is None else mx.concatenate([self.history, hist], 1)
        # Position of column c in row b: cached real tokens + c - padding of row b.
        base = before - mx.array(pad, dtype=mx.int32)
        done = 0
        grouped = all(has_rows_view(c, L) for c in self.cache)
        if L > 1 and start == 0 and grouped:
            self._prefill_groups(tokens, pad, base, progress, input_embeddings)
            done = L - 1
        while L - done > 1:
            n = min(self.prefill_step_size, L - done - 1)
            cache = self.cache
            if done == 0 and start > 0 and any(pad):
                # Rows start at different columns after cached tokens: one write
                # moves every pad column before its row's cached slots.
                n = max(n, max(pad))
                shift = mx.array(pad, dtype=mx.int32)
                cache = [ShiftedView(c, shift) for c in self.cache]
            emb = None if input_embeddings is None else input_embeddings[:, done : done + n]
            self.model(tokens[:, done : done + n], offset=base + done, cache=cache,
                       **({"input_embeddings": emb} if emb is not None else {}))
            mx.eval([c.state for c in self.cache])
            done += n
            if progress is not None:
                progress(done, L)
        emb = None if input_embeddings is None else input_embeddings[:, done:]
        logits = self.model(tokens[:, done:], offset=base + done, cache=self.cache,
                            **({"input_embeddings": emb} if emb is not None else {}))
        self.cache.add_padding(pad)
        self._plan_decode_groups()
        return self._sample(logits[:, -1, :])

    def _prefill_groups(self, tokens, padding, base, progress, input_embeddings):
        """Prefill ``tokens[:, :-1]`` group by group (``plan_prefill_groups``) so rows
        skip the leading columns that are padding for their whole group.

        Each group writes into its rows of the shared caches through row views
        (``rows_view``: ``RowsView`` for key/value caches, ``StateRowsView`` for
        recurrent state) that start at the group's first real column; key slots before
        it stay zero and are padding of those rows (masked), and state rows start from
        zero, what the skipped padding columns (identity steps) leave. Every row sees
        exactly what a one-group prefill gives it: its own tokens after padding.
        """
        B, L = tokens.shape
        width = L - 1
        lengths = [width - min(int(p), width) for p in padding]
        groups = plan_prefill_groups(lengths)
        total = sum((stop - start) * max(lengths[start:stop]) for start, stop in groups)
        processed = 0
        for start, stop in groups:
            longest = max(lengths[start:stop])
            if longest == 0:
                continue  # one-token prompts: nothing before their last token
            first = width - longest
            views = [rows_view(c, start, stop, first, B, width) for c in self.cache]
            offset = base[start:stop] + first
            done = 0
            while done < longest:
                n = min(self.prefill_step_size, longest - done)
                cols = slice(first + done, first + done + n)
                kwargs = {}
                if input_embeddings is not None:
                    kwargs["input_embeddings"] = input_embeddings[start:stop, cols]
                self.model(tokens[start:stop, cols], offset=offset + done, cache=views, **kwargs)
                mx.eval([v.state for v in views])
                done += n
                processed += (stop - start) * n
                if progress is not None:
                    progress(max(1, round(width * processed / total)), L)

    def step(self, tokens):
        """Feed one token per row ``(B,)``; return the queued next ``(tokens, logprobs)``."""
        if self.logits_processors:
            self.history = mx.concatenate([self.history, tokens[:, None]], axis=1)
        kwargs = {}
        if self._decode_groups:
            kwargs["attention"] = StepAttention(row_groups=self._decode_groups)
        logits = self.model(tokens[:, None], offset=self.offset, cache=self.cache, **kwargs)
        return self._sample(logits[:, -1, :])

    def _plan_decode_groups(self):
        """Plan decode attention row groups from the rows' padding.

        Every row attends over all the batch's slots, most of them padding for the
        short rows. On the CPU, where attention is a large share of a batched decode
        step, the shared ``Attention`` layer splits the rows into contiguous groups
        ``(start, stop, first_slot)`` that each skip the slots padding for the whole
        group (same result: those keys are masked). Devices with fused attention
        (``mx.fast``) keep one call; so do ring caches, whose slots are not in order.
        Each step adds one key to every row, which adds the same cost to every
        grouping, so the plan holds until the padding changes.
        """
        self._decode_groups = None
        padding = self.cache.padding
        if padding is None or mx.default_device() != mx.cpu or len(padding) < 2:
            return
        if not all(type(c) is KVCache for c in self.cache):
            return
        keys = max(padding) + 1  # any count above every row's padding plans the same
        lengths = [keys - p for p in padding]
        groups = plan_prefill_groups(lengths, DECODE_GROUP_OVERHEAD_KEYS, float("inf"))
        if len(groups) > 1:
            self._decode_groups = [(a, b, min(padding[a:b])) for a, b in groups]

    def _sample(self, logits):
        for processor in self.logits_processors:
            logits = processor(self.history, logits)
        if self.sampler is greedy_sampler:
            # The argmax of the logits is that of the log-probabilities, whose
            # log-softmax (an exp over the vocabulary per row) is skipped when unused.
            tokens = mx.argmax(logits, axis=-1)
            if not self.want_logprobs:
                return tokens, None
            return tokens, logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampler(logprobs), logprobs

    def filter(self, keep):
        """Keep only rows ``keep`` (list of indices); drop padding they all share."""
        self.cache.filter(keep)
        if self.history is not None:
            self.history = self.history[mx.array(keep, dtype=mx.int32)]
        self._plan_decode_groups()

    def extend(self, other):
        """Append the rows of ``other``, a ``BatchEngine`` on the same model prefilled
        on its own caches, to this batch (continuous batching: rows join mid-decode).

        The caches join with their rows' padding (``PromptCache.extend`` left-pads
        the side with fewer slots). Token histories are left-padded with ``PAD_ID``
        to one width. ``other`` must not be used afterwards (its arrays are shared).
        """
        self.cache.extend(other.cache)
        if self.logits_processors:
            if self.history is None or other.history is None:
                raise ValueError("cannot extend: both batches need token histories for processors")
            width = max(self.history.shape[1], other.history.shape[1])
            pad = lambda h: mx.concatenate(  # noqa: E731
                [mx.full((h.shape[0], width - h.shape[1]), PAD_ID, h.dtype), h], axis=1)
            self.history = mx.concatenate([pad(self.history), pad(other.history.astype(self.history.dtype))])
        else:
            self.history = None
        self.decode_reserve = max(self.decode_reserve, other.decode_reserve)
        self._plan_decode_groups()
