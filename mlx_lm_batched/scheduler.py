"""Continuous batching: ``BatchGenerator`` with the interface of mlx-lm 0.32's.

Rows (requests) are inserted at any time and generate in one running decode batch.
New rows are prefilled in groups of similar length, each group on its own
:class:`~mlx_lm_batched.batching.BatchEngine` and in chunks of ``prefill_step_size``
columns: each ``next()`` runs one decode step for the running rows and then one
prefill chunk, so a long prompt never stalls decoding for more than one chunk.
A group whose prompts are done joins the decode batch (``BatchEngine.extend``);
a finished row leaves it at once (``BatchEngine.filter``). Every row generates
what its prompt generates alone: the engine keeps per-row positions and padding.

Each row has its own ``max_tokens``, stop sequences, sampler, logits processors
and, optionally, a prompt cache from an earlier turn to continue from.
"""

import contextlib
import time
from collections import deque
from dataclasses import asdict

import mlx.core as mx

from . import row_caches
from .batch_rows import PromptResponse, Response, Row, RowGroup
from .batching import BatchEngine, left_pad, plan_prefill_groups
from .generate_utils import BatchCounters, BatchCountersSnapshot, BatchStats
from .row_sampling import RowOps, TokenContext
from .sample_utils import greedy_sampler
from .stop_sequences import StopSequences, make_stop_sequences  # noqa: F401  (re-export)


class BatchGenerator:
    """Continuous batching over one model (drop-in for ``mlx_lm.generate.BatchGenerator``).

    ``insert``/``insert_segments`` queue rows and return their uids; each ``next()``
    returns ``(prompt responses, generation responses)`` of one step; ``remove``
    drops rows (optionally returning their caches). ``stop_tokens`` are the default
    stop sequences (lists of token ids, or bare ids) of rows inserted without their own.
    """

    Response = Response
    PromptResponse = PromptResponse

    def __init__(self, model, *, max_tokens=128, stop_tokens=None, sampler=None,
                 logits_processors=None, completion_batch_size=32, prefill_batch_size=8,
                 prefill_step_size=2048, max_kv_size=None, stream=None):
        for name, value in (("completion_batch_size", completion_batch_size),
                            ("prefill_batch_size", prefill_batch_size),
                            ("prefill_step_size", prefill_step_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.model = model
        self.max_tokens = max_tokens
        self.sampler = sampler or greedy_sampler
        self.logits_processors = list(logits_processors or [])
        self.prefill_step_size = prefill_step_size
        self.prefill_batch_size = prefill_batch_size
        self.completion_batch_size = max(completion_batch_size, prefill_batch_size)
        self.max_kv_size = max_kv_size
        self._stream = stream
        self._default_stops = StopSequences(stop_tokens)
        self._uid_count = 0
        self._queue = deque()  # rows waiting for prefill
        self._groups = []  # prefill groups, first in first out
        self._decode = None  # the running decode BatchEngine
        self._decode_ops = None  # its RowOps; ``_decode_ops.rows`` are its rows
        self._pending = None  # queued (tokens, logprobs) of the decode rows' next step
        self._counters = BatchCounters()

    @property
    def stream(self):
        return self._stream

    def close(self):
        """Release resources (nothing is pinned; kept for mlx-lm compatibility)."""
        if self._decode is not None and self._pending is not None:
            mx.eval(self._pending)

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
               logits_processors=None, stop_sequences=None, seeds=None):
        """Queue token prompts; returns their uids. ``caches[i]`` (a prompt cache from
        an earlier turn, or None) holds ``all_tokens[i]``; the prompt continues it.

        ``seeds[i]`` (an int, or None) gives row ``i`` its own random key stream: its
        sampler (its own or the generator's, made by ``make_sampler``) is copied with
        ``seeded(seed)``, so its tokens do not depend on the other rows. A custom
        sampler callable cannot be seeded (``ValueError``); greedy rows ignore the seed.
        """
        return self.insert_segments([[p] for p in prompts], max_tokens, caches, all_tokens,
                                    samplers, logits_processors, stop_sequences, seeds)

    def _seeded(self, sampler, seed, uid):
        sampler = sampler or self.sampler
        if seed is None or sampler is greedy_sampler:
            return sampler
        if not hasattr(sampler, "seeded"):
            raise ValueError(f"seeds: prompt {uid}'s sampler cannot be seeded (a custom "
                             f"callable); use make_sampler(...) or make_seeded_sampler(...)")
        return sampler.seeded(seed)

    def insert_segments(self, segments, max_tokens=None, caches=None, all_tokens=None,
                        samplers=None, logits_processors=None, stop_sequences=None, seeds=None):
        """Like :meth:`insert` with each prompt given as a list of segments: prefill
        reports ``end_of_segment`` (and the cache can be extracted) at each segment end."""
        n = len(segments)
        options = {
            "max_tokens": max_tokens or [self.max_tokens] * n,
            "caches": caches or [None] * n,
            "all_tokens": all_tokens or [[] for _ in range(n)],
            "samplers": samplers or [None] * n,
            "logits_processors": logits_processors or [self.logits_processors] * n,
            "stop_sequences": stop_sequences or [self._default_stops] * n,
            "seeds": seeds or [None] * n,
        }
        for name, values in options.items():
            if len(values) != n:
                raise ValueError(f"{name} must have one entry per prompt: expected {n}, got {len(values)}")
        uids = list(range(self._uid_count, self._uid_count + n))
        rows = []
        for i, (uid, segs) in enumerate(zip(uids, segments)):
            segs = [[int(t) for t in s] for s in segs if len(s)]
            several = len(segs) > 1
            if not segs:
                raise ValueError(f"prompt {uid} is empty: nothing to generate from")
            if options["caches"][i] is not None:
                row_caches.check_cache(options["caches"][i], f"caches[{i}]")
            m = options["max_tokens"][i]
            if m <= 0:
                raise ValueError(f"max_tokens of prompt {uid} must be > 0, got {m}")
            if len(segs[-1]) != 1:  # the last token starts generation: its own segment
                segs = segs[:-1] + [segs[-1][:-1], segs[-1][-1:]]
            prompt = [t for s in segs for t in s]
            ends = [sum(len(s) for s in segs[: j + 1]) for j in range(len(segs))]
            stops = options["stop_sequences"][i]
            rows.append(Row(
                uid, prompt, ends, m, options["caches"][i], list(options["all_tokens"][i]),
                self._seeded(options["samplers"][i], options["seeds"][i], uid),
                tuple(options["logits_processors"][i] or ()),
                (stops if stops is not None else self._default_stops).matcher(),
                cut_at_segments=several,
            ))
        self._queue.extend(rows)
        self._uid_count += n
        return uids

    def _find(self, uids):
        """``{uid: (where, group or None, index)}`` for the rows among ``uids``."""
        uids, found = set(uids), {}
        for i, row in enumerate(self._queue):
            if row.uid in uids:
                found[row.uid] = ("queue", None, i)
        for g in self._groups:
            for i, row in enumerate(g.rows):
                if row.uid in uids:
                    found[row.uid] = ("prefill", g, i)
        if self._decode is not None:
            for i, row in enumerate(self._decode_ops.rows):
                if row.uid in uids:
                    found[row.uid] = ("decode", None, i)
        return found

    def _row_cache(self, where, group, i):
        if where == "queue":
            row = self._queue[i]
            return row.cache if row.cache is not None else row_caches.new_cache(self.model, self.max_kv_size)
        if where == "prefill":
            if group.col == 0:  # nothing fed yet: the cache as given
                row = group.rows[i]
                if row.cache is not None:
                    return row.cache
                return row_caches.new_cache(self.model, self.max_kv_size)
            return row_caches.extract_engine_row(group.engine, i)
        return row_caches.extract_engine_row(self._decode, i)

    def extract_cache(self, uids):
        """``{uid: (prompt cache, tokens in it)}`` for the rows still present."""
        out = {}
        for uid, (where, group, i) in self._find(uids).items():
            rows = {"queue": self._queue, "prefill": group.rows if group else None,
                    "decode": self._decode_ops.rows if self._decode else None}[where]
            out[uid] = (self._row_cache(where, group, i), list(rows[i].tokens))
        return out

    def remove(self, uids, return_prompt_caches=False):
        """Drop rows wherever they are; returns ``extract_cache(uids)`` when asked, else {}."""
        caches = self.extract_cache(uids) if return_prompt_caches else {}
        found = self._find(uids)
        gone = {uid for uid, (where, _, _) in found.items() if where == "queue"}
        self._queue = deque(r for r in self._queue if r.uid not in gone)
        for g in list(self._groups):
            keep = [i for i, r in enumerate(g.rows) if r.uid not in found]
            if len(keep) < len(g.rows):
                self._filter_group(g, keep)
        if self._decode is not None:
            rows = self._decode_ops.rows
            keep = [i for i, r in enumerate(rows) if r.uid not in found]
            if len(keep) < len(rows):
                self._filter_decode(keep)
        return caches

    def _filter_group(self, g, keep):
        if not keep:
            self._groups.remove(g)
            return
        if g.col > 0:
            g.engine.filter(keep)
        g.rows[:] = [g.rows[i] for i in keep]
        g.tokens = g.tokens[mx.array(keep)]
        g.padding = [g.padding[i] for i in keep]

    def _filter_decode(self, keep):
        if not keep:
            self._decode = self._decode_ops = self._pending = None
            return
        self._decode.filter(keep)
        rows = self._decode_ops.rows
        rows[:] = [rows[i] for i in keep]
        idx = mx.array(keep)
        self._pending = (self._pending[0][idx], self._pending[1][idx])

    @property
    def prompt_cache_nbytes(self):
        """Bytes held by the prompt caches of every row (queued, prefilling, decoding)."""
        total = sum(row_caches.cache_nbytes(r.cache) for r in self._queue)
        total += sum(row_caches.engine_nbytes(g.engine) for g in self._groups)
        if self._decode is not None:
            total += row_caches.engine_nbytes(self._decode)
        return total

    # Prefill
    def _admit(self):
        """Move queued rows into prefill groups (rows of similar length together)."""
        in_prefill = sum(len(g.rows) for g in self._groups)
        decoding = len(self._decode_ops.rows) if self._decode is not None else 0
        n = min(self.prefill_batch_size - in_prefill,
                self.completion_batch_size - decoding - in_prefill, len(self._queue))
        if n <= 0:
            return
        rows = [self._queue.popleft() for _ in range(n)]
        # A row with a cache or with segment stops is prefilled alone.
        alone = [r for r in rows if row_caches.cache_length(r.cache) or r.cut_at_segments]
        shared = sorted((r for r in rows if r not in alone), key=lambda r: len(r.prompt))
        for r in alone:
            self._groups.append(self._make_group([r]))
        lengths = [len(r.prompt) for r in shared]
        for start, stop in plan_prefill_groups(lengths) if shared else ():
            self._groups.append(self._make_group(shared[start:stop]))

    def _make_group(self, rows):
        cache = rows[0].cache if len(rows) == 1 else None
        cache = row_caches.copy_cache(cache) if row_caches.cache_length(cache) else None
        ops = RowOps(list(rows), self.sampler)
        engine = BatchEngine(self.model, ops.sample, [ops.process], cache, self.max_kv_size,
                             self.prefill_step_size)
        tokens, padding = left_pad([r.prompt for r in rows])
        width = tokens.shape[1]
        engine.reserve(width - min(width, self.prefill_step_size) + max(r.max_tokens for r in rows))
        cuts = rows[0].boundaries if len(rows) == 1 and rows[0].cut_at_segments else []
        return RowGroup(ops.rows, engine, ops, tokens, padding, cuts=list(cuts))

    def _prefill_step(self):
        """Feed one chunk of the first group; a group that is done joins decoding."""
        g = self._groups[0]
        start, width = g.col, g.tokens.shape[1]
        end = min(start + self.prefill_step_size, width, *[c for c in g.cuts if c > start] or [width])
        if start == 0:
            # The engine takes each row's left padding with the first chunk, which must
            # hold at least one real token of every row (prompts are right-aligned).
            end = max(end, min(width, max(g.padding) + 1))
        last = end == width
        g.ops.active = last  # earlier chunks' sampled tokens are discarded
        if last:
            for r in g.rows:
                if r.logits_processors:
                    r.context = TokenContext(r.tokens + r.prompt[r.done:])
        tic = time.perf_counter()
        pad = g.padding if start == 0 and any(g.padding) else None
        y, logprobs = g.engine.prefill(g.tokens[:, start:end], pad)
        if last:
            mx.eval(y, logprobs)
        else:
            mx.eval(y)  # runs the chunk (the caches it writes)
        self._counters.prompt_time += time.perf_counter() - tic
        g.col = end
        responses = []
        for r, p in zip(g.rows, g.padding):
            fed = r.prompt[max(0, start - p) : max(0, end - p)]
            r.tokens.extend(fed)
            r.done += len(fed)
            self._counters.prompt_tokens += len(fed)
            responses.append(PromptResponse(r.uid, (r.done, len(r.prompt)),
                                            last or (bool(fed) and r.done in r.boundaries), last))
        if last:
            self._groups.pop(0)
            self._join(g, (y, logprobs))
        return responses

    def _join(self, g, first_step):
        if self._decode is None:
            self._decode, self._decode_ops, self._pending = g.engine, g.ops, first_step
            return
        self._decode.extend(g.engine)
        self._decode_ops.rows.extend(g.rows)
        y, logprobs = self._pending
        self._pending = (mx.concatenate([y, first_step[0].astype(y.dtype)]),
                         mx.concatenate([logprobs, first_step[1].astype(logprobs.dtype)]))

    # Decode
    def _decode_step(self):
        """Feed the queued tokens, queue the next step, and report the fed tokens."""
        rows = self._decode_ops.rows
        y, logprobs = self._pending
        for i, r in enumerate(rows):
            if r.logits_processors:
                r.context.append(y[i : i + 1])
        next_step = self._decode.step(y)
        mx.async_eval(*next_step)
        self._pending = next_step
        tokens = y.tolist()
        responses, keep = [], []
        for i, (r, t) in enumerate(zip(rows, tokens)):
            r.tokens.append(t)
            r.generated += 1
            finish = "length" if r.generated >= r.max_tokens else None
            if r.matcher.advance(t):
                finish = "stop"
            if finish is None:
                keep.append(i)
                responses.append(Response(r.uid, t, logprobs[i], None, None, None))
            else:
                cache = row_caches.extract_engine_row(self._decode, i)
                responses.append(Response(r.uid, t, logprobs[i], finish, cache, list(r.tokens)))
        if len(keep) < len(rows):
            self._filter_decode(keep)
        return responses

    def _next(self):
        prompt_responses, generation_responses = [], []
        if self._decode is not None:
            tic = time.perf_counter()
            generation_responses = self._decode_step()
            self._counters.decode_time += time.perf_counter() - tic
            self._counters.generation_tokens += len(generation_responses)
            self._counters.generation_steps += 1
        decoding = len(self._decode_ops.rows) if self._decode is not None else 0
        if decoding >= self.completion_batch_size:
            return prompt_responses, generation_responses
        self._admit()
        # One chunk while rows are decoding; with none decoding, prefill until a group
        # joins or a segment ends (the caller may extract the cache there).
        while self._groups:
            chunk = self._prefill_step()
            prompt_responses.extend(chunk)
            if self._decode is not None or any(r.end_of_segment for r in chunk):
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
