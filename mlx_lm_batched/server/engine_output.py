"""What one step of the engine's ``BatchGenerator`` sends to the jobs: prompt progress
(a row has started: the job stops waiting), each generated token as a :class:`Delta` (its
text, its logprobs), an echoed prompt, and a row's end (:class:`Finished`, its blocks
stored for later prompts and released). A mixin of :class:`~.engine.Engine`, on the
engine thread: it reads the engine's rows, generator, prefix cache and metrics."""

import time

from .events import Delta, Finished
from .row_state import prompt_logprobs, token_logprobs


class EngineOutput:
    """The step and what it sends (see the module docstring)."""

    def _step(self):
        prompt_responses, responses = self.gen.next()
        now = time.monotonic()
        for p in prompt_responses:
            row = self._rows.get(p.uid)
            if row is None:
                continue
            done = p.progress[0]
            self.metrics.add_tokens(prompt=done - row.prefilled)
            row.prefilled = done
            self._mark_started(row, now)
            if p.end_of_prompt and self.leaders.leads(p.uid):
                self._lead_done(row)
            if p.end_of_prompt and row.echo is not None:
                self._echo(row, p.prompt_logprobs)
        gen_tokens = 0
        for r in responses:
            row = self._rows.get(r.uid)
            if row is None:
                continue
            gen_tokens += 1
            self._mark_started(row, now)
            self._on_token(row, r)
        self.metrics.add_tokens(generation=gen_tokens)
        self._grow_reservations()

    def _mark_started(self, row, now):
        if row.started:
            return
        row.started = True
        self.metrics.observe_queue_time(now - row.job.arrival)
        if all(r.started for r in row.job.rows):
            self._unwait(row.job)

    def _on_token(self, row, r):
        job = row.job
        params = job.spec.params
        entries = []
        if params.logprobs:
            entries = [token_logprobs(self.tokenizer, r.token, r.logprobs, params.top_logprobs)]
        text, finish = row.add_token(r.token, r.finish_reason)
        if finish == "stop" and r.finish_reason is None:  # a stop string: leave the batch now
            caches = self.gen.remove([r.uid], return_prompt_caches=True)
            if r.uid in caches:
                cache, tokens = caches[r.uid]
                self._store_prefix(r.uid, tokens, cache, job.spec.adapter)
        elif r.finish_reason is not None and r.prompt_cache is not None:
            self._store_prefix(r.uid, r.all_tokens, r.prompt_cache, job.spec.adapter)
            # Its blocks are stored: let the row's cache go now. Rows that end in one
            # step would otherwise each hold a copy of their cache until the step's
            # last response (5 rows of 1,500 tokens: 0.35 GB beyond the KV bound).
            r.prompt_cache = None
        if text or entries:
            job.send(Delta(row.index, text, entries))
        if finish is not None:
            self._finish(row, finish)

    def _echo(self, row, scores):
        """Send an echo row's prompt (and its scores); end it there for max_tokens 0."""
        job = row.job
        text, tokens = row.echo
        row.echo = None  # sent once (a resumed row ends its prompt again)
        entries = prompt_logprobs(self.tokenizer, tokens, scores) if scores is not None else []
        job.send(Delta(row.index, text, entries))
        if job.spec.params.max_tokens == 0:
            self.gen.remove([row.uid])
            self._finish(row, "length")

    def _finish(self, row, reason):
        del self._rows[row.uid]
        self.heap.rows_left()
        self.prefix.release(row.uid)
        self._start_followers(self.leaders.done(row.uid))
        row.job.send(Finished(row.index, reason, row.generated))
        if all(x.uid not in self._rows for x in row.job.rows):
            self._end_job(row.job)
