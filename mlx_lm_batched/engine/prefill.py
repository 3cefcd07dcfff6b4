"""Feeding a left-padded ``(B, L)`` prompt into a batch's caches, one model call at a time.

A :class:`PrefillJob` is what ``BatchEngine.start_prefill`` returns: each ``advance()``
runs one model call (a chunk of at most ``prefill_step_size`` columns, and at most
``advance(token_budget)`` prompt tokens, rows x columns, when a budget is given), so a
scheduler can interleave a long prompt with the decode steps of running rows, and the last
call gives the first sampled token of every row.

All columns but the last go through the model without logits (only the caches are
evaluated). Into fresh caches whose layers can be viewed by rows (``has_rows_view``: full
key/value caches, recurrent state, rings the prompt does not wrap) they go group by
group (``plan_prefill_groups``), so rows skip the leading columns that are padding for
their whole group; each group writes its rows of the shared caches through row views
(``RowsView``, ``StateRowsView``) starting at the group's first real column. Every row
sees exactly what a one-group prefill gives it: its own tokens after padding. The last
column, for all rows at once, gives the first sampled token. Rows given in ``score``
also keep their prompt tokens' log-probabilities from each call's logits
(:class:`~.prompt_scores.PromptScores`, ``scores``).
"""

import mlx.core as mx

from ..cache.views import ShiftedView, has_rows_view, rows_view
from ..layers.lora import adapter_rows
from ..layers.step import StepAttention
from .prefill_plan import plan_prefill_groups
from .prompt_scores import PromptScores


class PrefillJob:
    """One prompt being fed into an engine's caches.

    ``fed[b]``: real tokens of row ``b`` fed so far; ``progress``: ``(columns done, L)``
    for progress reports; ``at_cut``: the last call ended at one of ``cuts`` (columns
    where a call must end, e.g. the end of a prompt segment); ``result``: the queued
    ``(tokens, logprobs)`` of step one once ``done``; ``scores``: the prompt tokens'
    log-probabilities of the rows in ``score`` (``{row: top alternatives}``), else None.
    """

    def __init__(self, engine, tokens, padding, input_embeddings=None, cuts=(), score=None):
        self.engine = engine
        self.tokens, self.padding = tokens, padding
        self.embeddings = input_embeddings
        self.cuts = sorted(int(c) for c in cuts)
        B, L = tokens.shape
        self.lengths = [L - p for p in padding]
        self.fed = [0] * B
        self.progress = (0, L)
        self.at_cut = False
        self.done = False
        self.result = None
        self.calls = 0  # model calls so far
        self.padding_tokens = 0  # padding columns computed (rows x columns)
        self.scores = PromptScores(tokens, padding, score) if score else None
        self._token_budget = None  # of the call ``advance`` is running
        self._steps = self._run()

    def advance(self, token_budget=None):
        """Run the next model call; returns True once the prompt is fed (``result`` set).

        ``token_budget``: at most this many prompt tokens (rows x columns, at least one
        column) in this call, so a scheduler bounds how long running rows wait for it.
        The last call (one column for every row) is never split."""
        if not self.done:
            self._token_budget = token_budget
            try:
                next(self._steps)
            except StopIteration as stop:
                self.done, self.result = True, stop.value
        return self.done

    def close(self):
        """Stop a job that will not be advanced again (its rows were removed): its
        suspended model-call loop refers to the job, a reference cycle that would keep
        the job's caches alive until Python's cycle collector runs."""
        self._steps.close()

    def run(self, progress=None):
        """Feed the whole prompt; ``progress(done, total)`` after every chunk."""
        while not self.advance():
            if progress is not None:
                progress(*self.progress)
        return self.result

    def _chunk(self, col, limit, rows):
        """Columns of the next call of ``rows`` rows from column ``col``: at most
        ``prefill_step_size`` and the call's token budget, never past ``limit`` or a cut."""
        step = self.engine.prefill_step_size
        if self._token_budget is not None:
            step = min(step, max(1, self._token_budget // rows))
        end = min(col + step, limit,
                  *[c for c in self.cuts if c > col] or [limit])
        return end - col

    def _call(self, tokens, offset, cache, cols, rows=slice(None), groups=None):
        kwargs = {}
        if groups:  # caches stored by row blocks: attention reads them by group
            kwargs["attention"] = StepAttention(row_groups=groups)
        if self.embeddings is not None:
            kwargs["input_embeddings"] = self.embeddings[rows, cols]
        with adapter_rows(self.engine.adapter_slots(rows)):
            logits = self.engine.model(tokens[rows, cols], offset=offset, cache=cache, **kwargs)
        if self.scores is not None:  # unscored calls leave the logits unevaluated
            self.scores.add(logits, rows.start or 0, cols.start)
        return logits

    def _fed_up_to(self, end, rows=None):
        """Rows ``rows`` (all by default) have fed every column before ``end``."""
        last = [n - 1 for n in self.lengths]  # the last column is fed by the final call
        for b in range(len(self.fed)) if rows is None else rows:
            self.fed[b] = min(max(0, end - self.padding[b]), last[b])
        self.at_cut = end in self.cuts

    def _run(self):
        engine, tokens, pad = self.engine, self.tokens, self.padding
        cache = engine.cache
        B, L = tokens.shape
        if engine.slots == 0:
            cache.reset()  # no slots: no rows either, whatever was there before
        start = engine.slots
        before = cache.offsets(B)  # real tokens per row (checks the row count)
        engine.reserve_for(B, start + L)
        engine.sampling.prompt(tokens, pad)
        # Position of column c in row b: cached real tokens + c - padding of row b.
        base = before - mx.array(pad, dtype=mx.int32)
        done = 0
        # Quantized caches switch after a model call (see ``KVQuantization``); a prompt
        # of several calls goes in whole-batch chunks so each call's switch is mlx-lm's.
        one_call = engine.kv_quant is None or L - 1 <= engine.prefill_step_size
        if L > 1 and start == 0 and one_call and all(has_rows_view(c, L) for c in cache):
            yield from self._groups(base)
            engine.quantize_caches()
            done = L - 1
        while L - done > 1:
            n = self._chunk(done, L - 1, B)
            views = cache
            if done == 0 and start > 0 and any(pad):
                # Rows start at different columns after cached tokens: one write
                # moves every pad column before its row's cached slots.
                n = max(n, max(pad))
                shift = mx.array(pad, dtype=mx.int32)
                views = [ShiftedView(c, shift) for c in cache]
            self._call(tokens, base + done, views, slice(done, done + n))
            engine.quantize_caches()
            mx.eval([c.buffers() if hasattr(c, "buffers") else c.state for c in cache])
            self.padding_tokens += sum(min(n, max(0, p - done)) for p in pad)
            done += n
            self.calls += 1
            self._fed_up_to(done)
            self.progress = (done, L)
            yield
        logits = self._call(tokens, base + done, cache, slice(done, None),
                            groups=engine.block_groups(B))
        engine.quantize_caches()
        self.calls += 1
        cache.add_padding(pad)
        engine.rows_changed()
        self.fed = list(self.lengths)
        self.progress = (L, L)
        return engine.sampling.sample(logits[:, -1, :])

    def _groups(self, base):
        """Columns ``[0, L - 1)`` group by group, one call per chunk of a group."""
        engine, tokens, pad = self.engine, self.tokens, self.padding
        B, L = tokens.shape
        width = L - 1
        lengths = [width - min(int(p), width) for p in pad]
        groups = plan_prefill_groups(lengths)
        total = sum((stop - start) * max(lengths[start:stop]) for start, stop in groups)
        processed = 0
        # Each group's rows in a buffer of their own (one group: the usual rectangle).
        own_block = len(groups) > 1 and engine.groups_rows()
        for start, stop in groups:
            longest = max(lengths[start:stop])
            if longest == 0:
                continue  # one-token prompts: nothing before their last token
            first = width - longest
            views = [rows_view(c, start, stop, first, B, width, own_block)
                     for c in engine.cache]
            offset = base[start:stop] + first
            done = 0
            while done < longest:
                n = self._chunk(first + done, width, stop - start)
                self._call(tokens, offset + done, views, slice(first + done, first + done + n),
                           slice(start, stop))
                mx.eval([v.state for v in views])
                self.padding_tokens += sum(min(n, max(0, pad[b] - first - done))
                                           for b in range(start, stop))
                done += n
                processed += (stop - start) * n
                self.calls += 1
                self._fed_up_to(first + done, range(start, stop))
                self.progress = (max(1, round(width * processed / total)), L)
                yield
