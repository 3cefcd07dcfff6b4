"""Continuous batching: ``BatchGenerator`` with the interface of mlx-lm 0.32's, and the one
batch loop this package has (``batch_generate``, the CLI and the server all run on it).

Rows (requests) are inserted at any time. Each ``next()`` is one scheduling step:

1. the running decode batch takes one step (queued before the previous step's tokens are
   read, so the device works while Python handles them);
2. queued rows are admitted while there is room: rows of fresh prompts together on one
   engine (sorted by length; the engine's prefill groups them so rows skip the columns
   that are padding for their whole group), rows that continue a cache or stop at
   segment ends alone;
3. one model call of the oldest prefill (a chunk of ``prefill_step_size`` columns, and of
   at most ``prefill_tokens_per_step`` prompt tokens when that is set), so a long prompt
   never stalls decoding rows for more than one chunk; with nothing decoding, prefill
   runs in whole chunks until a batch joins. A finished prefill joins the decode batch.

A finished or removed row stays in its batch, ignored, until dropping it pays (dropping
copies the caches: it pays once the steps it saves reach one step of the whole batch) or
until new rows join. Every row generates what its prompt generates alone: the engine
keeps per-row positions, padding and sampling state.
"""

import contextlib
import time
from collections import deque
from dataclasses import asdict

import mlx.core as mx

from ..cache import row_caches
from ..cache.factory import make_prompt_cache
from ..layers.lora import adapter_slot_count
from ..sampling.samplers import greedy_sampler
from ..sampling.stop_sequences import StopSequences
from . import suspension
from .admission import build_rows, requests_from_lists
from .options import GeneratorOptions
from .batch_rows import PromptResponse, Response
from .prefill_start import start_prefill
from .stats import BatchCounters, BatchCountersSnapshot, BatchStats


class BatchGenerator:
    """Continuous batching over one model (drop-in for ``mlx_lm.generate.BatchGenerator``).

    ``options``: a :class:`~.options.GeneratorOptions`; mlx-lm's keywords (and ours, the
    fields of ``GeneratorOptions``) make one or replace its fields.

    ``insert_requests`` (:class:`~.request.Request`\\ s), or mlx-lm's parallel-list
    ``insert``/``insert_segments``, queue rows and return their uids; each ``next()``
    returns ``(prompt responses, generation responses)`` of one step; ``remove`` drops
    rows (optionally returning their caches). ``stop_tokens`` are the default stop
    sequences (lists of token ids, or bare ids) of rows inserted without their own.

    Beyond mlx-lm's keywords: ``return_logprobs=False`` leaves ``Response.logprobs``
    None (greedy rows then skip the log-softmax), ``return_caches=False`` leaves a finished
    row's ``prompt_cache`` None (no copy of its cache), and ``token_hook(tokens)`` sees
    every sampled ``(B,)`` array (a tensor-parallel server shares rank 0's tokens).

    ``prefill_tokens_per_step`` (None: no bound) bounds the prompt tokens (rows x
    columns) of the one prefill call a step makes while rows are decoding: smaller
    bounds keep running streams' inter-token latency near one decode step while prompts
    join, at the cost of the joining rows' first token; with nothing decoding prefill
    goes in whole ``prefill_step_size`` chunks.

    Speculative decoding: ``draft_model`` (same tokenizer) or ``prompt_lookup=True``
    drafts ``num_draft_tokens`` tokens per row and step (``engine/speculative.py``);
    rows keep different numbers of them, and a step may report several tokens per row.
    """

    Response = Response
    PromptResponse = PromptResponse

    # mlx-lm's attributes, read from the options (which are fixed once made).
    max_tokens = property(lambda self: self.options.max_tokens)
    sampler = property(lambda self: self.options.sampler or greedy_sampler)
    logits_processors = property(lambda self: list(self.options.logits_processors))
    prefill_batch_size = property(lambda self: self.options.prefill_batch_size)
    prefill_step_size = property(lambda self: self.options.prefill_step_size)
    max_kv_size = property(lambda self: self.options.max_kv_size)

    def __init__(self, model, options=None, *, stream=None, token_hook=None, **keywords):
        # mlx-lm 0.32's keywords (and ours) fill or override the options object.
        options = GeneratorOptions.of(options, **keywords) if keywords or options is None \
            else options
        if not isinstance(options, GeneratorOptions):
            raise TypeError(f"options must be a GeneratorOptions, got {type(options).__name__}")
        self.options = options
        self.model = model
        self.completion_batch_size = max(options.completion_batch_size,
                                         options.prefill_batch_size)
        self.token_hook = token_hook
        self._adapter_slots = adapter_slot_count(model)
        self._stream = stream
        self._default_stops = StopSequences(options.stop_tokens)
        self._uid_count = 0
        self._rows = {}  # uid -> Row, for every row not finished or removed
        self._queue = deque()  # rows waiting for prefill
        self._prefills = []  # Batch per admission, first in first out
        self._decode = None  # the decode Batch
        self._suspended = {}  # uid -> Row taken out by ``suspend``, until ``resume``
        self._counters = BatchCounters()

    @property
    def stream(self):
        return self._stream

    def close(self):
        """Wait for the work the last steps queued (a decode step is queued before its
        tokens are read, also when its rows then finish): the caller may go on from
        another thread, whose work MLX would not order after it. Nothing else is held."""
        mx.synchronize()

    @contextlib.contextmanager
    def stats(self):
        """Yields a :class:`BatchStats` filled, on exit, with the work done in the block."""
        stats = BatchStats()
        start = BatchCountersSnapshot(**asdict(self._counters))
        try:
            yield stats
        finally:
            stats += BatchCountersSnapshot.between(
                start, BatchCountersSnapshot(**asdict(self._counters)))

    # Inserting and removing rows
    def insert(self, prompts, max_tokens=None, caches=None, all_tokens=None, samplers=None,
               logits_processors=None, stop_sequences=None, seeds=None, prompt_logprobs=None,
               adapters=None):
        """Queue token prompts; returns their uids. ``caches[i]`` (a prompt cache from
        an earlier turn, or None) holds ``all_tokens[i]``; the prompt continues it.

        ``prompt_logprobs[i]`` (an int ``k >= 0``, or None) scores row ``i``'s prompt
        from its own prefill logits: its last ``PromptResponse`` carries each prompt
        token's log-probability after the first, with the ``k`` most likely tokens
        (the tokens of ``caches[i]`` are not scored).

        ``seeds[i]`` (an int, or None) gives row ``i`` its own random key stream: its
        sampler (its own or the generator's, made by ``make_sampler``) is copied with
        ``seeded(seed)``, so its tokens do not depend on the other rows. A custom
        sampler callable cannot be seeded (``ValueError``); greedy rows ignore the seed.

        ``adapters[i]``: the adapter slot of row ``i`` on a model with several adapters
        (``loading.adapters.attach_adapters``: 0 the base model, ``k`` the k-th adapter;
        None: the model's default). Rows with different adapters share batches.
        """
        return self.insert_segments([[p] for p in prompts], max_tokens, caches, all_tokens,
                                    samplers, logits_processors, stop_sequences, seeds,
                                    prompt_logprobs, adapters)

    def insert_segments(self, segments, max_tokens=None, caches=None, all_tokens=None,
                        samplers=None, logits_processors=None, stop_sequences=None, seeds=None,
                        prompt_logprobs=None, adapters=None):
        """Like :meth:`insert` with each prompt given as a list of segments: prefill
        reports ``end_of_segment`` (and the cache can be extracted) at each segment end."""
        lists = {"max_tokens": max_tokens, "caches": caches, "all_tokens": all_tokens,
                 "samplers": samplers, "logits_processors": logits_processors,
                 "stop_sequences": stop_sequences, "seeds": seeds,
                 "prompt_logprobs": prompt_logprobs, "adapters": adapters}
        return self.insert_requests(requests_from_lists(segments, self._uid_count, lists))

    def insert_requests(self, requests):
        """Queue :class:`~.request.Request`\\ s; returns their uids (in order). Every
        request is checked against this generator (its adapter slot, its seed and
        sampler) before any is queued."""
        rows = build_rows(list(requests), self._uid_count, self.options, self._default_stops,
                          self._adapter_slots)
        self._queue.extend(rows)
        self._rows.update((r.uid, r) for r in rows)
        self._uid_count += len(rows)
        return [r.uid for r in rows]

    def _locate(self, uid):
        """``(batch or None, index)`` of a live row: None for a queued row."""
        for batch in [*self._prefills, self._decode]:
            if batch is not None and uid in batch.uids and uid not in batch.dead:
                return batch, batch.uids.index(uid)
        return None, None

    def _row_cache(self, row, batch, i, views=False):
        """Row ``row``'s cache now and the tokens it holds."""
        if batch is not None and (batch is self._decode or batch.job.done or (
                row.cut_at_segments and batch.job.calls)):
            return batch.extract(i, row, views), list(row.tokens)
        # Queued, or in a prefill that has not fed it (a shared prefill writes rows group
        # by group): the cache it came with holds exactly the tokens it came with.
        held = row.tokens[: len(row.tokens) - row.done]
        if row.cache is not None:
            return row.cache, held
        return make_prompt_cache(self.model, self.options.max_kv_size), held

    def extract_cache(self, uids, views=False):
        """``{uid: (prompt cache, tokens in it)}`` for the rows still present.

        ``views=True``: a running row's attention slots are slices of the batch's
        buffers rather than copies, for a caller that stores them (copying what it
        keeps) and drops them before the next :meth:`next`; held longer, they stay
        correct but cost a copy of the buffer they slice at its next write."""
        out = {}
        for uid in uids:
            row = self._rows.get(uid)
            if row is not None:
                out[uid] = self._row_cache(row, *self._locate(uid), views)
        return out

    def remove(self, uids, return_prompt_caches=False):
        """Drop rows wherever they are; returns ``extract_cache(uids)`` when asked, else {}."""
        caches = self.extract_cache(uids) if return_prompt_caches else {}
        for uid in uids:  # a suspended row is dropped where it waits
            self._suspended.pop(uid, None)
        gone = {uid for uid in uids if uid in self._rows}
        self._queue = deque(r for r in self._queue if r.uid not in gone)
        for uid in gone:
            batch, _ = self._locate(uid)
            if batch is not None:
                batch.dead.add(uid)
            del self._rows[uid]
        self._close_empty_prefills()
        if self._decode is not None and not self._decode.live:
            self._retire_decode()
        return caches

    def _close_empty_prefills(self):
        """Drop the prefills whose rows are all gone, closing each: its suspended call loop
        refers to it, so its caches would wait for Python's cycle collector."""
        for batch in self._prefills:
            if not batch.live:
                batch.job.close()
        self._prefills = [b for b in self._prefills if b.live]

    def suspend(self, uids):
        """Take rows out of the batch, keeping what they need to go on later with the same
        tokens (``sched/suspension.py``): returns ``(responses, caches)``, the token each
        decoding row had already sampled (handle them as ``next()``'s) and ``{uid: (prompt
        cache, tokens in it)}`` of the suspended decoding rows. Not for speculative batches."""
        return suspension.suspend(self, uids)

    def resume(self, uid, cache=None, cached_tokens=0):
        """Queue suspended row ``uid`` again (first); ``cache`` holds the first
        ``cached_tokens`` of :meth:`suspended_tokens` and the row prefills the rest."""
        suspension.resume(self, uid, cache, cached_tokens)

    def suspended_tokens(self, uid):
        """Every token suspended row ``uid`` holds: what a cache for its resume may hold."""
        return suspension.suspended_tokens(self, uid)

    @property
    def prompt_cache_nbytes(self):
        """Bytes held by the prompt caches of every row (queued, prefilling, decoding)."""
        total = sum(row_caches.cache_nbytes(r.cache) for r in self._queue)
        total += sum(b.engine.nbytes for b in self._prefills)
        if self._decode is not None:
            total += self._decode.engine.nbytes
        return total

    @property
    def finished_nbytes(self):
        """About the cache bytes the decode batch still holds for rows that finished or
        were removed (it drops them when that pays, ``_compact``): its share of them."""
        batch = self._decode
        if batch is None or not batch.dead:
            return 0
        return batch.engine.nbytes * len(batch.dead) // len(batch.uids)

    # Scheduling
    def _in_prefill(self):
        return sum(b.live for b in self._prefills)

    def _decoding(self):
        return 0 if self._decode is None else self._decode.live

    def _admit(self):
        """Move queued rows into prefills: fresh prompts on one engine, rows with a cache
        or with segment ends alone."""
        in_prefill = self._in_prefill()
        n = min(self.options.prefill_batch_size - in_prefill,
                self.completion_batch_size - self._decoding() - in_prefill, len(self._queue))
        if n <= 0:
            return
        rows = [self._queue.popleft() for _ in range(n)]
        alone = [r for r in rows if row_caches.cache_length(r.cache) or r.cut_at_segments]
        shared = sorted((r for r in rows if r not in alone), key=lambda r: len(r.prompt))
        for group in [[r] for r in alone] + ([shared] if shared else []):
            self._prefills.append(self._start_prefill(group))

    def _start_prefill(self, rows):
        return start_prefill(self.model, rows, self.options, self.token_hook)

    def _prefill_call(self, token_budget=None):
        """One model call of the oldest prefill (within ``token_budget`` prompt tokens);
        a prefill that is done joins decoding."""
        batch = self._prefills[0]
        job = batch.job
        tic = time.perf_counter()
        done = job.advance(token_budget)
        if done:
            mx.eval(*[x for x in job.result if x is not None])
        self._counters.prompt_time += time.perf_counter() - tic
        responses = []
        for i, uid in enumerate(batch.uids):
            if uid in batch.dead:
                continue
            r = self._rows[uid]
            fed = r.prompt[r.done : job.fed[i]]
            r.tokens.extend(fed)
            r.done += len(fed)
            self._counters.prompt_tokens += len(fed)
            scores = job.scores.of_row(i) if done and r.prompt_logprobs is not None else None
            responses.append(PromptResponse(r.uid, (r.done, len(r.prompt)),
                                            done or (bool(fed) and r.done in r.boundaries), done,
                                            scores))
        if done:
            self._counters.padding_tokens += job.padding_tokens
            self._prefills.pop(0)
            self._join(batch, job.result)
        return responses

    def _join(self, batch, first_step):
        if batch.dead:  # rows removed while they were prefilled
            first_step = batch.drop_dead(first_step)
        if self._decode is None:
            batch.job, batch.pending = None, first_step
            self._decode = batch
        else:
            self._decode.join(batch, first_step)

    def _decode_step(self):
        """Feed the queued tokens, queue the next step, and report the fed tokens."""
        batch = self._decode
        y, logprobs, *drafted = batch.pending
        kept = drafted[0] if drafted else [()] * len(batch.uids)
        if self.options.return_caches or any(
                self._rows[u].generated + len(kept[i]) + 1 < self._rows[u].max_tokens
                for i, u in enumerate(batch.uids) if u not in batch.dead):
            batch.pending = batch.engine.step(y)
            mx.async_eval(*[x for x in batch.pending if x is not None])
        else:  # every row ends with these tokens and no cache is returned: no next step
            batch.pending = None
        responses = []
        for i, (uid, t) in enumerate(zip(batch.uids, y.tolist())):
            lp = None if logprobs is None else logprobs[i]
            # Kept drafts come before the row's next token (speculative decoding).
            for t, lp in [*kept[i], (t, lp)]:
                if uid in batch.dead:
                    break
                responses.append(self._report(batch, i, uid, t, lp))
        self._compact()
        return responses

    def _report(self, batch, i, uid, t, lp):
        """Record row ``i``'s token ``t``; its response (with its cache when it ends)."""
        r = self._rows[uid]
        r.tokens.append(t)
        r.generated += 1
        finish = "length" if r.generated >= r.max_tokens else None
        if r.matcher.advance(t):
            finish = "stop"
        if finish is None:
            return Response(uid, t, lp, None, None, None)
        cache = None
        if self.options.return_caches:
            cache = batch.extract(i, r)
        batch.dead.add(uid)
        del self._rows[uid]
        return Response(uid, t, lp, finish, cache, list(r.tokens))

    def _retire_decode(self):
        """Drop the decode batch, its rows all gone. The step it queued last (for the
        caches of rows that ended with it) still holds the batch's caches while it runs:
        wait for it, so that memory is free when this step returns (the stream would run
        it before any later work anyway)."""
        pending, self._decode = self._decode.pending, None
        if pending is not None:
            mx.eval(*[x for x in pending if isinstance(x, mx.array)])

    def _compact(self):
        """Drop the decode batch's dead rows once the steps they would still cost reach
        one step of the whole batch (the filter copies the caches: about one step)."""
        batch = self._decode
        if not batch.dead:
            return
        if not batch.live:
            self._retire_decode()
            return
        remaining = max(self._rows[u].max_tokens - self._rows[u].generated
                        for u in batch.uids if u not in batch.dead)
        if len(batch.dead) * remaining >= len(batch.uids):
            batch.pending = batch.drop_dead(batch.pending)

    def _next(self):
        prompt_responses, generation_responses = [], []
        if self._decode is not None:
            tic = time.perf_counter()
            generation_responses = self._decode_step()
            self._counters.decode_time += time.perf_counter() - tic
            self._counters.generation_tokens += len(generation_responses)
            self._counters.generation_steps += 1
        if self._decoding() >= self.completion_batch_size:
            return prompt_responses, generation_responses
        self._admit()
        # While rows decode, a step's prefill calls feed up to ``prefill_tokens_per_step``
        # prompt tokens (rows x columns); unbounded, its first call is a whole chunk and
        # further calls fill up to ``prefill_step_size``. A prefill that finishes ends the
        # step: its rows' first tokens are reported at the start of the next step (one
        # decode step later), not after the next prefills of this one. Rows that prefill
        # alone (a later turn continuing its cached prefix) thus start one per step, each
        # with its own first token as soon as it is computed.
        limit = self.options.prefill_tokens_per_step
        step_budget, spent = limit or self.options.prefill_step_size, 0
        while self._prefills:
            decoding, job = self._decoding(), self._prefills[0].job
            before = sum(job.fed) + job.padding_tokens  # rows x columns computed
            call_budget = (step_budget - spent) if decoding and (spent or limit) else None
            chunk = self._prefill_call(call_budget)
            prompt_responses.extend(chunk)
            # A segment end the caller asked for (``insert_segments``) ends the step, so it
            # may extract the cache there; while rows decode, a prompt's own last-token
            # split does not.
            if any(r.end_of_segment and (not decoding or self._rows[r.uid].cut_at_segments)
                   for r in chunk):
                break
            if job.done and self._decoding():
                break  # its rows joined decoding
            if not decoding:
                continue
            spent += max(1, sum(job.fed) + job.padding_tokens - before)
            if spent >= step_budget or self._decoding() >= self.completion_batch_size:
                break
        return prompt_responses, generation_responses

    def next(self):
        """One step: ``(prompt responses, generation responses)``."""
        with self._on_stream():
            return self._next()

    def next_generated(self):
        """Step until some row generates a token (or nothing is left); return those."""
        with self._on_stream():
            while True:
                prompt_responses, generation_responses = self._next()
                if generation_responses or not prompt_responses:
                    return generation_responses

    def _on_stream(self):
        return mx.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
