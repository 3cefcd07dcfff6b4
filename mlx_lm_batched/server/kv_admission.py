"""The server's KV memory bound: what admitted requests reserve, and the requests waiting
for memory that running ones hold.

A request reserves, before its rows start, the key/value slots of its prompt plus its
``max_tokens`` (quantized past ``quantized_kv_start`` with ``--kv-bits``) and each row's
recurrent state, times ``n``. Prompt tokens its rows will read from shared KV blocks held in
memory (``reused_tokens``) are not reserved: those blocks are the block store's, bounded by
``--prompt-cache-bytes``, and the rows read them in place. One that fits beside the running requests starts; one that
does not waits, first come first served, until running requests end and release theirs
(never a 429 for memory); one that could never fit is a 400 naming the bound.
"""

from collections import deque

from ..engine.kv_budget import quantized_need
from .errors import APIError


class KVAdmission:
    """Reservations against ``config.max_kv_bytes`` (None: no bound), read at each check."""

    def __init__(self, config, reused_tokens=None):
        self.config = config
        # (job, prompt) -> tokens of ``prompt`` its rows will read from shared blocks.
        self.reused_tokens = reused_tokens or (lambda job, prompt: 0)
        self.kv_bytes_per_token = 0  # key/value bytes per token of a row (set after warm-up)
        self.quantized_kv_bytes_per_token = 0  # the same once quantized (--kv-bits)
        self.state_bytes_per_row = 0  # recurrent-state bytes per row
        self.reserved = 0
        self.waiting = deque()  # (job, prompts, max_tokens) waiting for memory, oldest first

    def need(self, n, prompts, max_tokens, reused=None):
        """Bytes a request of ``n`` choices per prompt reserves (``reused[i]``: tokens of
        prompt ``i`` read from shared blocks, not reserved)."""
        c = self.config
        start = c.quantized_kv_start if c.kv_bits is not None else None
        kv = (lambda slots: slots * self.kv_bytes_per_token) if start is None else (
            lambda slots: quantized_need(slots, self.kv_bytes_per_token,
                                         self.quantized_kv_bytes_per_token, start))
        reused = reused or [0] * len(prompts)
        return n * sum(kv(len(p) - r + m) + self.state_bytes_per_row
                       for p, m, r in zip(prompts, max_tokens, reused))

    def reserve(self, job, prompts, max_tokens):
        """Reserve ``job``'s bytes; False when they do not fit beside the running
        requests' yet, APIError(400) when they never can."""
        need = self.need(job.spec.params.n, prompts, max_tokens,
                         [self.reused_tokens(job, p) for p in prompts])
        limit = self.config.max_kv_bytes
        if limit is not None and need > limit:
            raise APIError(400, f"This request needs about {need} bytes of KV cache and state "
                           f"(prompt + max_tokens, times n), over the {limit} bytes of KV "
                           f"memory requests may hold (--kv-memory / --max-kv-bytes, less "
                           f"the prefix cache's share).",
                           "max_tokens", "request_too_large")
        if limit is not None and self.reserved + need > limit:
            return False
        job.reserved = need
        self.reserved += need
        return True

    def admit(self, job, prompts, max_tokens):
        """True when ``job`` may start now (its bytes reserved); else it waits behind the
        requests already waiting (first come first served) and this returns False."""
        if self.waiting or not self.reserve(job, prompts, max_tokens):
            self.waiting.append((job, prompts, max_tokens))
            return False
        return True

    def ready(self):
        """The waiting requests whose bytes are now reserved, oldest first (cancelled ones
        are dropped on the way); stops at the first that still does not fit."""
        while self.waiting:
            job, prompts, max_tokens = self.waiting[0]
            if not job.cancelled and not self.reserve(job, prompts, max_tokens):
                return
            self.waiting.popleft()
            if not job.cancelled:
                yield job, prompts, max_tokens

    def release(self, job):
        """Give back what ``job`` reserved (idempotent)."""
        self.reserved -= job.reserved
        job.reserved = 0
