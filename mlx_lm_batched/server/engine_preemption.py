"""Preemption for the server's engine: when a running row needs KV memory the bound has
not got, the newest request leaves the batch and waits first in line; it resumes later
with the tokens it would have generated had it never left.

Rows reserve their tokens plus ``--kv-growth-tokens`` ahead (``server/kv_admission.py``).
After each step, a row about to write past its reservation asks for more; if the bound
has none, the newest running request (the latest to arrive, possibly the asking row's
own) is preempted: its rows are suspended (``BatchGenerator.suspend``: the token each had
sampled is sent first, and each keeps its sampler, context and stop matcher), their KV
is parked in the prefix cache (full blocks stored, shared and spilled to the disk tier
like any prefix, the partial block's slots kept), and its reservation is released. The
oldest request can always grow (it fit alone when admitted), so every request finishes.
A resumed row reads its parked blocks and slots back and recomputes nothing it held (or,
where the store evicted them, recomputes what is missing: the same tokens, within the
float bound of docs/architecture.md).
"""

import logging

log = logging.getLogger("mlx_lm_batched.server")


class EnginePreemption:
    """The :class:`~.engine.Engine` methods that grow reservations and preempt."""

    preempts = True  # the distributed engine does not (its followers replay inserts only)

    def _grow_reservations(self):
        """After a step: give rows about to pass their reservation ``growth`` more slots,
        preempting the newest requests while the bound has not got them."""
        growth = self.admission.growth
        if not growth or self.config.max_kv_bytes is None:
            return
        for row in list(self._rows.values()):
            grant = row.kv
            if row.uid not in self._rows or grant is None or not grant.needs_more(row.generated):
                continue
            new = min(grant.granted + growth, grant.cap)
            while row.uid in self._rows and not self.admission.grow(row.job, grant.granted, new):
                self._preempt(self._newest_preemptible())
            if row.uid in self._rows:
                grant.granted = new

    def _newest_preemptible(self):
        jobs = {id(r.job): r.job for r in self._rows.values() if r.job.preemptible}
        return max(jobs.values(), key=lambda job: job.id)

    def _preempt(self, job):
        """Suspend ``job``'s rows (parking their KV), release its memory, queue its resume."""
        live = [r for r in job.rows if r.uid in self._rows]
        responses, caches = self.gen.suspend([r.uid for r in live])
        for r in responses:  # the tokens they had sampled (a row may end with it)
            self._on_token(self._rows[r.uid], r)
        suspended = [r for r in live if r.uid in self._rows]
        for row in suspended:
            cache, tokens = caches.get(row.uid, (None, None))
            row.parked = None
            if cache is not None and self.config.prompt_cache_size:
                row.parked = self.prefix.park(self.model, tokens, cache, job.spec.adapter)
            del self._rows[row.uid]
            self.heap.rows_left()
            self.prefix.release(row.uid)
            self._start_followers(self.leaders.done(row.uid))
        if not suspended:
            return  # every row ended with the token it had sampled
        job.suspended = suspended
        self.admission.release(job)
        self.admission.wait_to_resume(job)
        self.metrics.count_preemption()
        log.info("preempted request %d (%d rows) for KV memory; %d requests waiting",
                 job.id, len(suspended), len(self.admission.waiting))

    def _resume_grants(self, job):
        """A :class:`KVGrant` per suspended row of ``job``: what it holds now, of its own
        (not in shared blocks held in memory), and ``growth`` ahead."""
        grants = []
        for row in job.suspended:
            tokens = self.gen.suspended_tokens(row.uid)
            own = len(tokens) - self._reused_tokens(job, tokens)
            grants.append(self.admission.grant(own, row.max_tokens, row.generated))
        return grants

    def _resume(self, job):
        """Put a preempted job's rows back (its reservation is made)."""
        for row, grant in zip(job.suspended, job.grants):
            tokens = self.gen.suspended_tokens(row.uid)
            cache, held = None, 0
            if self.config.prompt_cache_size:
                cache, held = self.prefix.unpark(self.model, row.parked, tokens,
                                                 job.spec.adapter)
            self.gen.resume(row.uid, cache, held)
            self.prefix.hold(row.uid, cache)
            row.parked, row.kv, row.prefilled = None, grant, 0
            self._rows[row.uid] = row
        job.suspended = []

    def _drop_suspended(self, job):
        """A preempted job was cancelled: forget its suspended rows."""
        if job.suspended:
            self.gen.remove([r.uid for r in job.suspended])
            job.suspended = []
