"""The server's KV memory bound: what running requests reserve, and the requests waiting
for memory that running ones hold.

A request's rows reserve, before they start, the key/value slots of their prompt plus the
next ``growth`` tokens (``--kv-growth-tokens``; all of ``max_tokens`` when growth is 0 or
the engine cannot preempt), quantized past ``quantized_kv_start`` with ``--kv-bits``, and
each row's recurrent state. A running row that reaches its reservation asks for ``growth``
more (:meth:`KVAdmission.grow`); when the bound has none left, the engine preempts the
newest request (``server/engine_preemption.py``). Prompt tokens a row reads from shared
KV blocks held in memory (``reused_tokens``) are not reserved: those blocks are the block
store's, bounded by ``--prompt-cache-bytes``, and the rows read them in place.

A request that fits beside the running ones starts; one that does not waits, first come
first served (preempted requests first), until running requests end or are preempted
(never a 429 for memory); one whose prompt + ``max_tokens`` could never fit is a 400
naming the bound.
"""

from collections import deque
from dataclasses import dataclass

from ..engine.kv_budget import quantized_need
from .errors import APIError


@dataclass
class KVGrant:
    """A row's reservation in slots of its own (prompt tokens it reads from shared blocks
    are not its own): ``granted`` so far, ``used`` when it (re)started and
    ``generated`` then, and ``cap``: what it can ever need (prompt + ``max_tokens``)."""

    granted: int
    used: int
    generated: int
    cap: int

    def needs_more(self, generated):
        """True when the next step would write past the grant (and the cap allows more)."""
        return self.used + generated - self.generated >= self.granted < self.cap


class KVAdmission:
    """Reservations against ``config.max_kv_bytes`` (None: no bound), read at each check.
    ``growth``: tokens a row reserves ahead of what it holds (0: all of ``max_tokens``)."""

    def __init__(self, config, reused_tokens=None, growth=0, resume_grants=None,
                 unreleased=None):
        self.config = config
        # Bytes the batch still holds for rows whose reservations were released (finished
        # rows it drops when that pays): a request starts only beside them too.
        self.unreleased = unreleased or (lambda: 0)
        # (job, prompt) -> tokens of ``prompt`` its rows will read from shared blocks.
        self.reused_tokens = reused_tokens or (lambda job, prompt: 0)
        # job -> a KVGrant per row of a preempted job, from what its rows hold now.
        self.resume_grants = resume_grants
        self.growth = growth
        self.kv_bytes_per_token = 0  # key/value bytes per token of a row (set after warm-up)
        self.quantized_kv_bytes_per_token = 0  # the same once quantized (--kv-bits)
        self.state_bytes_per_row = 0  # recurrent-state bytes per row
        self.reserved = 0
        # (job, prompts, max_tokens) waiting for memory, oldest first; a preempted job
        # waits as (job, None, None) (``resume_grants(job)`` says what it needs).
        self.waiting = deque()

    def kv_bytes(self, slots):
        """Key/value bytes of one row holding ``slots`` slots of its own."""
        c = self.config
        if c.kv_bits is None:
            return slots * self.kv_bytes_per_token
        return quantized_need(slots, self.kv_bytes_per_token,
                              self.quantized_kv_bytes_per_token, c.quantized_kv_start)

    def grant(self, own, max_tokens, generated=0, preemptible=True):
        """The :class:`KVGrant` of a row starting with ``own`` slots of its own, that may
        generate ``max_tokens`` in all and has generated ``generated``."""
        left = max_tokens - generated
        ahead = min(left, self.growth) if self.growth and preemptible else left
        return KVGrant(own + ahead, own, generated, own + left)

    def grants_bytes(self, grants):
        return sum(self.kv_bytes(g.granted) + self.state_bytes_per_row for g in grants)

    def need(self, n, prompts, max_tokens, reused=None):
        """Bytes a request of ``n`` choices per prompt needs to finish (``reused[i]``:
        tokens of prompt ``i`` read from shared blocks, not reserved)."""
        reused = reused or [0] * len(prompts)
        return n * sum(self.kv_bytes(len(p) - r + m) + self.state_bytes_per_row
                       for p, m, r in zip(prompts, max_tokens, reused))

    def reserve(self, job, prompts, max_tokens):
        """Reserve ``job``'s bytes (``job.grants``: one :class:`KVGrant` per prompt, for each
        of its ``n`` rows); False
        when they do not fit beside the running requests' yet, APIError(400) when its
        prompt + ``max_tokens`` never can."""
        reused = [self.reused_tokens(job, p) for p in prompts]
        n = job.spec.params.n
        limit = self.config.max_kv_bytes
        if limit is not None:
            full = self.need(n, prompts, max_tokens, reused)
            if full > limit:
                raise APIError(400, f"This request needs about {full} bytes of KV cache and "
                               f"state (prompt + max_tokens, times n), over the {limit} bytes "
                               f"of KV memory requests may hold (--kv-memory / --max-kv-bytes, "
                               f"less the prefix cache's share).",
                               "max_tokens", "request_too_large")
        grants = [self.grant(len(p) - r, m, preemptible=job.preemptible)
                  for p, m, r in zip(prompts, max_tokens, reused)]
        if not self._take(job, n * self.grants_bytes(grants), held=self.unreleased()):
            return False
        job.grants = grants
        return True

    def _take(self, job, need, alone_ok=False, held=0):
        limit = self.config.max_kv_bytes
        if limit is not None and self.reserved + held + need > limit and not (
                alone_ok and self.reserved == job.reserved):
            return False
        job.reserved += need
        self.reserved += need
        return True

    def grow(self, job, old, new):
        """Grow one of ``job``'s rows from ``old`` to ``new`` slots; False when the bound
        has not the bytes (a job holding every reservation always gets them: it fit alone
        when admitted, and a resume may have lost shared blocks it read)."""
        return self._take(job, self.kv_bytes(new) - self.kv_bytes(old), alone_ok=True)

    def admit(self, job, prompts, max_tokens):
        """True when ``job`` may start now (its bytes reserved); else it waits behind the
        requests already waiting (first come first served) and this returns False."""
        if self.waiting or not self.reserve(job, prompts, max_tokens):
            self.waiting.append((job, prompts, max_tokens))
            return False
        return True

    def wait_to_resume(self, job):
        """``job`` was preempted (its reservation released): it waits first in line."""
        self.waiting.appendleft((job, None, None))

    def ready(self):
        """The waiting requests whose bytes are now reserved, oldest first (cancelled ones
        are dropped on the way); stops at the first that still does not fit."""
        while self.waiting:
            job, prompts, max_tokens = self.waiting[0]
            if not job.cancelled:
                if prompts is None:  # preempted: what its rows hold now, and growth
                    grants = self.resume_grants(job)
                    if not self._take(job, self.grants_bytes(grants), alone_ok=True):
                        return
                    job.grants = grants
                elif not self.reserve(job, prompts, max_tokens):
                    return
            self.waiting.popleft()
            if not job.cancelled:
                yield job, prompts, max_tokens

    def release(self, job):
        """Give back what ``job`` reserved (idempotent)."""
        self.reserved -= job.reserved
        job.reserved = 0
