"""The engine: one thread owns the model, the tokenizer and ONE ``BatchGenerator``.

Requests arrive as :class:`Job` objects on a queue; the thread tokenizes them, checks
them against the context length and the KV memory budget, inserts one row per choice
(continuing from the longest cached prefix, if any), steps the batch and sends each
job's events (:class:`Started`, :class:`Delta`, :class:`Finished`, :class:`Failed`) to
the job's asyncio queue. A cancelled job's rows leave the batch at the next step.
Nothing else touches MLX, so no lock guards the model or the caches.
"""

import itertools
import logging
import queue
import threading
import time
import traceback
from dataclasses import replace

import mlx.core as mx

from .. import _malloc
from ..engine.batch_engine import KVQuantization
from ..engine.kv_budget import cache_layout
from ..models.context import context_length
from ..sched import capabilities
from ..sched.generator import BatchGenerator
from ..sched.block_prefix import make_prefix_cache
from ..sched.request import Request
from .errors import APIError
from .events import EngineConfig, Failed, Job, Started
from .engine_output import EngineOutput
from .engine_preemption import EnginePreemption
from .engine_prefix import EnginePrefix
from .job_prep import prepare_prompts
from .kv_admission import KVAdmission
from .prefix_leaders import PrefixLeaders
from .metrics import Metrics
from .row_state import RowState
from .sampling import SamplerFactory, row_processors, row_stops

# Resident memory allowed above the loaded server beyond its KV bounds (a step's
# temporaries): past it, freed heap goes back at once (``_malloc.ResidentCeiling``).
CEILING_MARGIN_BYTES = 128 << 20

log = logging.getLogger("mlx_lm_batched.server")


class Engine(EngineOutput, EnginePrefix, EnginePreemption):
    """Owns generation; :meth:`submit` and :meth:`cancel` are safe from any thread."""

    # How this engine serves, in capability-table features (requests are checked against).
    serving_features = frozenset()
    embeds = True  # runs embedding work (see :meth:`run`)
    prefix_blocks = True  # prefix reuse over shared KV blocks where the model allows it

    def __init__(self, model, tokenizer, config=None, metrics=None, draft_model=None,
                 on_fatal=None):
        self.model, self.tokenizer = model, tokenizer
        self.draft_model = draft_model  # speculative decoding's draft (same tokenizer)
        self.config = config or EngineConfig()
        self.on_fatal = on_fatal  # called (engine thread) when the engine cannot go on
        self.fatal = None  # then: the error line
        self.features = self.serving_features | capabilities.speculative_features(
            draft_model, self.config.prompt_lookup)
        self.metrics = metrics or Metrics()
        self.context_length = self.config.context_length or context_length(model)
        self.vocab_size = self._vocab_size()
        c = self.config
        self.prefix = make_prefix_cache(
            model, entries=c.prompt_cache_size, max_bytes=c.prompt_cache_bytes, kv_bits=c.kv_bits,
            block_size=c.kv_block_size, disk_dir=c.kv_disk_dir, disk_bytes=c.kv_disk_bytes,
            blocks=self.prefix_blocks and bool(c.prompt_cache_size))
        self.leaders = PrefixLeaders(self.prefix)  # cold prompts that share a prefix
        self.samplers = SamplerFactory()
        # The KV memory bound (sized in warm_up); cached prefix blocks are not reserved.
        # Rows reserve --kv-growth-tokens ahead and are preempted when the bound is
        # reached, except on speculative batches (whose rows cannot be suspended).
        growth = c.kv_growth_tokens if self.preempts and not self.speculative else 0
        self.admission = KVAdmission(self.config, self._reused_tokens, growth,
                                     self._resume_grants, lambda: self.gen.finished_nbytes)
        self._commands = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards _waiting_jobs (read by the event loop)
        self._waiting_jobs = 0
        self._rows = {}  # uid -> RowState
        # Freed heap goes back to the system after rows leave (resident size follows the
        # arrays held; see _malloc.HeapRelease).
        self.heap = _malloc.HeapRelease()
        self.ceiling = None  # a _malloc.ResidentCeiling while the thread runs under a KV bound
        self._thread = None
        self._stopping = False
        self._last_gauges = 0.0
        self.gen = self._new_generator()

    def _vocab_size(self):
        """Rows of the input embedding (a quantized one keeps them too), else the tokenizer's."""
        embed = getattr(getattr(self.model, "model", None), "embed_tokens", None)
        weight = getattr(embed, "weight", None)
        return int(weight.shape[0]) if weight is not None else len(self.tokenizer)

    def generator_options(self):
        """Keyword arguments of the engine's ``BatchGenerator`` (plain JSON values)."""
        return dict(stop_tokens=[[int(t)] for t in self.tokenizer.eos_token_ids],
                    completion_batch_size=self.config.max_batch,
                    prefill_batch_size=self.config.prefill_batch,
                    prefill_step_size=self.config.prefill_step_size,
                    prefill_tokens_per_step=self.config.prefill_tokens_per_step,
                    kv_bits=self.config.kv_bits, kv_group_size=self.config.kv_group_size,
                    quantized_kv_start=self.config.quantized_kv_start)

    @property
    def speculative(self):
        return "speculative" in self.features

    def _new_generator(self):
        options = self.generator_options()
        if self.speculative:
            options.update(draft_model=self.draft_model, prompt_lookup=self.config.prompt_lookup,
                           num_draft_tokens=self.config.num_draft_tokens)
        return BatchGenerator(self.model, **options)

    # Lifecycle
    def warm_up(self):
        """Generate two tokens once (compiles the paths) and measure the cache bytes a
        request reserves: per token (key/value slots) and per row (recurrent state)."""
        prompt = self.tokenizer.encode("Hello", add_special_tokens=False) or [0]
        self.gen.insert_requests([Request.of(prompt * 4, max_tokens=2)])
        while True:
            _, responses = self.gen.next()
            if any(r.finish_reason for r in responses):
                break
        # The model's cache layout, not the arrays' shapes: a state array's axes are
        # not slots (it does not grow with the sequence). Unknown kinds count nothing.
        models = [self.model] + ([self.draft_model] if self.draft_model is not None else [])
        layout = [entry for m in models for entry in cache_layout(m) if entry is not None]
        self.admission.kv_bytes_per_token = sum(per_slot for per_slot, _ in layout)
        self.admission.state_bytes_per_row = sum(fixed for _, fixed in layout)
        c = self.config
        quant = KVQuantization.of(c.kv_bits, c.kv_group_size, c.quantized_kv_start)
        quantized = [entry for entry in cache_layout(self.model, quant) if entry is not None]
        self.admission.quantized_kv_bytes_per_token = sum(per_slot for per_slot, _ in quantized)
        self.gen.close()
        self.gen = self._new_generator()

    def start(self):
        """Start the engine thread (the gauges are set first: ``/metrics`` names the KV
        bound from the server's first answer, not from the thread's first loop)."""
        self._update_gauges()
        self._thread = threading.Thread(target=self._run, name="mlx-lm-batched-engine", daemon=True)
        self._thread.start()
        if self.config.max_kv_bytes:
            # The process may hold its KV bound and a step's temporaries above what it
            # holds now, loaded; the heap's freed memory beyond that goes back.
            self.ceiling = _malloc.ResidentCeiling(
                _malloc.resident_bytes() + self.config.max_kv_bytes
                + self.config.prompt_cache_bytes + CEILING_MARGIN_BYTES)
            self.ceiling.start()

    def stop(self, timeout=10.0):
        """Stop the thread (rows still running are abandoned); waits up to ``timeout`` s."""
        self._stopping = True
        self._commands.put(("stop", None))
        if self._thread is not None:
            self._thread.join(timeout)
        if self.ceiling is not None:
            self.ceiling.stop()
        if not self.alive:  # (a thread still in a step may yet use the prefix cache)
            self.prefix.close()  # the disk tier's queued blocks reach the disk

    @property
    def alive(self):
        return self._thread is not None and self._thread.is_alive()

    # Called from the event loop
    def submit(self, spec, loop, event_queue):
        """Queue a request; raises APIError(429) when too many are waiting, 503 when
        the engine is stopping."""
        if self._stopping:
            raise APIError(503, "The server is stopping.", None, "server_stopping")
        with self._lock:
            if self._waiting_jobs >= self.config.max_waiting:
                raise APIError(429, f"Too many waiting requests ({self._waiting_jobs}); retry later.",
                               None, "too_many_requests", retry_after=1)
            self._waiting_jobs += 1
        job = Job(spec, event_queue, loop, id=next(self._ids))
        self._commands.put(("submit", job))
        return job

    def run(self, work):
        """Queue ``work()`` for the engine thread, between batch steps: work that needs the
        model but no row of the batch (embeddings); it delivers its own result."""
        if self._stopping:
            raise APIError(503, "The server is stopping.", None, "server_stopping")
        self._commands.put(("run", work))

    def cancel(self, job):
        """Drop a job's rows (a client went away); idempotent."""
        self._commands.put(("cancel", job))

    @property
    def waiting_jobs(self):
        with self._lock:
            return self._waiting_jobs

    # The thread
    def _run(self):
        while not self._stopping:
            try:
                self._drain(block=not self._rows)
                self._start_memory_waiting()
                if self._rows:
                    self._step()
                else:
                    self._idle()
                self.heap.tick()
                self._update_gauges()
            except Exception:
                self._step_failed()
        self._closing()

    # Hooks (the distributed engine, server/distributed_engine.py, overrides them)
    def _idle_wait(self):
        """Seconds an idle loop waits for a command (a bound only: commands wake it)."""
        return 0.25

    def _idle(self):
        """Called once per loop while no row is in the batch."""

    def _step_failed(self):
        """A step raised: fail the rows in flight and keep serving on a fresh batch."""
        log.error("generation step failed:\n%s", traceback.format_exc())
        self._fail_all("generation failed: " + traceback.format_exc(limit=1).strip().splitlines()[-1])

    def _closing(self):
        """Called once when the thread ends."""

    def _drain(self, block):
        while True:
            try:
                cmd, job = (self._commands.get(timeout=self._idle_wait()) if block
                            else self._commands.get_nowait())
            except queue.Empty:
                return
            block = False
            if cmd == "stop":
                self._stopping = True
                return
            if cmd == "submit":
                self._start_job(job)
            elif cmd == "cancel":
                self._cancel_job(job)
            elif cmd == "run":
                job()

    def _unwait(self, job):
        if job.waiting:
            job.waiting = False
            with self._lock:
                self._waiting_jobs -= 1

    def _start_job(self, job):
        if job.cancelled:
            return self._unwait(job)
        self._for_this_job_only(job, self._insert, job)

    def _for_this_job_only(self, job, step, *args):
        """Run ``step(*args)``; an error (a bad template, a tokenizer error) fails ``job``
        alone."""
        try:
            step(*args)
        except APIError as e:
            self._end_job(job)
            job.send(Failed(e))
        except Exception as e:
            log.warning("request failed: %s", traceback.format_exc())
            self._end_job(job)
            job.send(Failed(APIError(400, f"Cannot prepare the request: {e}", None, "invalid_request")))

    def _insert(self, job):
        """Tokenize, check and reserve, then insert one row per choice; a job whose KV
        memory is not free yet waits for it (``server/kv_admission.py``)."""
        params = job.spec.params
        prompts, max_tokens = prepare_prompts(job.spec, self.tokenizer, self.vocab_size,
                                              self.context_length, self.config.default_max_tokens)
        score = params.echo and params.logprobs
        self._check_features(params, score)
        leader = None if score or not self.config.prompt_cache_size else \
            self.leaders.leader_for(prompts, job.spec.adapter)
        if leader is not None:  # a running row is prefilling this prompt's prefix
            self.leaders.follow(leader, (job, prompts, max_tokens))
            return
        self._admit(job, prompts, max_tokens)

    def _admit(self, job, prompts, max_tokens):
        if self.admission.admit(job, prompts, max_tokens):
            self._insert_rows(job, prompts, max_tokens)

    def _start_memory_waiting(self):
        """Start the jobs waiting for KV memory (preempted ones first, then in arrival
        order) while theirs is free."""
        for job, prompts, max_tokens in self.admission.ready():
            if prompts is None:
                self._resume(job)
            else:
                self._for_this_job_only(job, self._insert_rows, job, prompts, max_tokens)

    def _insert_rows(self, job, prompts, max_tokens):
        """Insert the rows of a job whose KV memory is reserved: one :class:`Request`
        per choice of each prompt, checked when made, all inserted together."""
        params = job.spec.params
        # Echo with logprobs scores the whole prompt: no prefix cache (its tokens are
        # not prefilled, so they would have no logits).
        score = params.echo and params.logprobs
        requests, states, cached = [], [], 0
        stops = row_stops(params, self.tokenizer)
        for i, prompt in enumerate(prompts):
            for j in range(params.n):
                cache, rest = ((None, list(prompt)) if score
                               else self._fetch_prefix(prompt, job.spec.adapter))
                if j == 0:
                    cached += len(prompt) - len(rest)
                index = i * params.n + j
                # max_tokens 0 (echo only): the row leaves once its prompt is scored.
                requests.append(Request.of(
                    rest, max_tokens=max(1, max_tokens[i]), cache=cache,
                    cached_tokens=prompt[: len(prompt) - len(rest)],
                    sampler=self.samplers.row_sampler(params, j),
                    logits_processors=row_processors(params, self.tokenizer),
                    stop_sequences=stops, prompt_logprobs=params.top_logprobs if score else None,
                    adapter=job.spec.adapter, label=f"choice {index}"))
                echo = None
                if params.echo:  # the prompt as given, or its token ids decoded
                    given = job.spec.prompts[i]
                    echo = (given if isinstance(given, str) else self.tokenizer.decode(prompt),
                            prompt)
                states.append(RowState(job, index, self.tokenizer, params, echo,
                                       max(1, max_tokens[i]), replace(job.grants[i])
                                       if job.grants else None))
        uids = self.gen.insert_requests(requests)
        for k, (uid, state, request) in enumerate(zip(uids, states, requests)):
            state.uid = uid
            self.prefix.hold(uid, request.cache)  # its prefix blocks stay pinned while it runs
            self._rows[uid] = state
            if not score and k % params.n == 0:  # may lead others to its prompt's blocks
                self.leaders.lead(uid, prompts[k // params.n], job.spec.adapter)
        job.rows = states
        self.metrics.add_tokens(cached=cached)
        job.send(Started(sum(len(p) for p in prompts), cached))

    def _check_features(self, params, score):
        """400 (the capability table's refusal) for what does not combine with how this
        engine serves."""
        asked = {"prompt_scoring"} if score else set()
        if row_processors(params, self.tokenizer):
            asked.add("logits_processors")
        found = capabilities.conflict(self.features | asked)
        if found is not None:
            raise APIError(400, found.message("http") + ".", found.param, found.code)

    def _cancel_job(self, job):
        job.cancelled = True
        self._drop_suspended(job)
        live = [r.uid for r in job.rows if r.uid in self._rows]
        if live:
            self.gen.remove(live)
            self.heap.rows_left()
            for uid in live:
                del self._rows[uid]
                self.prefix.release(uid)
                self._start_followers(self.leaders.done(uid))
        self._end_job(job)

    def _end_job(self, job):
        self._unwait(job)
        self.admission.release(job)

    def _fail_all(self, message):
        jobs = {id(r.job): r.job for r in self._rows.values()}
        # Preempted jobs waiting to resume had their rows in the failed batch too.
        preempted = [w for w in self.admission.waiting if w[1] is None]
        for entry in preempted:
            self.admission.waiting.remove(entry)
            jobs[id(entry[0])] = entry[0]
            entry[0].suspended = []
        for uid in self._rows:
            self.prefix.release(uid)
        self._rows.clear()
        self.heap.rows_left()
        for job in jobs.values():
            self._end_job(job)
            job.send(Failed(APIError(500, message, None, "generation_failed")))
        self.gen = self._new_generator()
        self._start_followers(self.leaders.leave_all())

    def _update_gauges(self):
        now = time.monotonic()
        if self._rows and now - self._last_gauges < 0.2:
            return
        self._last_gauges = now
        running = sum(r.started for r in self._rows.values())
        self.metrics.set_gauges(
            running_rows=running, waiting_rows=len(self._rows) - running,
            waiting_requests=self.waiting_jobs, kv_cache_bytes=self.gen.prompt_cache_nbytes,
            kv_reserved_bytes=self.admission.reserved,
            kv_budget_bytes=self.config.max_kv_bytes or 0,
            kv_waiting_requests=len(self.admission.waiting), prefix_cache_bytes=self.prefix.nbytes,
            memory_active_bytes=mx.get_active_memory(), memory_peak_bytes=mx.get_peak_memory(),
            memory_cache_bytes=mx.get_cache_memory(),
            memory_resident_bytes=_malloc.resident_bytes(),
            **self.prefix.gauges())
