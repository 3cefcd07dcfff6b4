"""The replay protocol of a tensor-parallel server: rank 0 decides, every rank computes.

Every rank holds a shard of the model, so every rank must run the same forward passes on
the same batch. Rank 0's engine owns admission, requests and streaming; it records what it
does to its ``BatchGenerator`` and prefix cache (the *ops*) and broadcasts them before each
step. The other ranks (:class:`Follower`) apply the same ops, in the same order, to a
generator and prefix cache of their own, so their batches, prefill groups, caches and row
uids stay equal to rank 0's without any decision of their own.

Ops (JSON lists): ``reset`` (a new generator, its options), ``fetch`` (a prefix-cache hit:
the prompt and how many tokens it covers), ``insert`` (uids and,
for each row, its prompt segments, max_tokens, cached tokens, which fetched cache it
continues and its stop sequences: ``replayed_row``), ``remove`` (uids), ``store`` (a
row's cache goes to the prefix cache; how many entries remain after eviction) and
``shutdown``. A message is ``{"ops": [...], "step": bool, "sleep": seconds}``: with ``step``
every rank then runs one ``next()``; without, the followers sleep ``sleep`` seconds before
waiting for the next message.

Wire: a message is sent with two ``mx.distributed.all_sum`` calls, its length then its
bytes, rank 0 contributing the data and the others zeros (MLX has no broadcast).

Sampling agrees because rank 0 broadcasts the sampled tokens: the generator's token hook
lets rank 0 sample and an ``all_sum`` (zeros elsewhere) hands its tokens to every rank
inside the same graph as the step. That is exact by construction, whatever the
sampler, seed or logits processor, and does not rely on every rank computing bit-identical
logits or consuming random numbers in the same order (shared seeds would); it costs one
all-reduce of ``B`` int32 per step. Followers therefore run no samplers or processors.

Idle: MLX's ring backend waits for a collective by polling (a rank blocked in ``all_sum``
for 8 s used 6.7-7.8 s of CPU), so followers must not wait in one while the server is idle.
When the batch empties, rank 0 sends a message without ``step``; the followers sleep and
rank 0 pings again when that sleep ends, the sleeps doubling from ``IDLE_SLEEP_MIN`` to
``IDLE_SLEEP_MAX``: an idle server does a few tiny collectives a second, a request waits at
most ``IDLE_SLEEP_MAX`` for the followers, and a follower that died is noticed at the next
ping even when no request comes.
"""

import json
import logging
import signal
import time

import mlx.core as mx
import numpy as np

from ..parallel.group import STEP_TIMEOUT, guard_collectives
from ..sched.generator import BatchGenerator
from ..sched.prefix_cache import LRUPromptCache
from ..sched.request import Request

log = logging.getLogger("mlx_lm_batched.server")

IDLE_SLEEP_MIN = 0.01  # seconds the followers sleep after the batch empties ...
IDLE_SLEEP_MAX = 0.2  # ... doubling up to this (a request waits at most this long)
_UNBOUNDED = 1 << 62


class ReplayError(RuntimeError):
    """A follower's state no longer matches rank 0's (a bug): the server must stop."""


def lost_peer(exc):
    """Whether ``exc`` is a collective failing because a peer went away (what
    :class:`~mlx_lm_batched.parallel.tensor.guard_collectives` turns into a clear exit)."""
    return isinstance(exc, RuntimeError) and ("[ring]" in str(exc) or "peer" in str(exc))


def broadcast(data, group):
    """Rank 0's ``data`` (bytes; None on the other ranks) on every rank."""
    root = group.rank() == 0
    n = mx.distributed.all_sum(mx.array(len(data) if root else 0, mx.int32), stream=mx.cpu,
                               group=group).item()
    buf = mx.array(np.frombuffer(data, np.uint8)) if root else mx.zeros((n,), mx.uint8)
    return bytes(np.array(mx.distributed.all_sum(buf, stream=mx.cpu, group=group)))


class RankZeroTokens:
    """A token hook (``BatchGenerator(token_hook=...)``) whose tokens are rank 0's: rank 0
    keeps what it sampled, the others contribute zeros, and an ``all_sum`` hands rank 0's
    tokens to every rank inside the same graph as the step."""

    def __init__(self, group):
        self.group = group

    def __call__(self, tokens):
        if self.group.rank() == 0:
            tokens = tokens.astype(mx.int32)
        else:
            tokens = mx.zeros(tokens.shape, mx.int32)
        return mx.distributed.all_sum(tokens, group=self.group)


class SharedTokensGenerator(BatchGenerator):
    """A ``BatchGenerator`` whose every sampled token is rank 0's (same on every rank)."""

    def __init__(self, model, group, **options):
        super().__init__(model, token_hook=RankZeroTokens(group), **options)
        self.group = group


class Recorder:
    """Rank 0's ops since the last message, and when to send the next one.

    ``send`` ticks a :class:`guard_collectives` watchdog: a follower that stalls (alive but
    silent) ends rank 0 after ``timeout`` seconds instead of hanging it.
    """

    def __init__(self, group, timeout=STEP_TIMEOUT):
        self.group = group
        self.ops = []
        self.guard = guard_collectives(timeout, group)
        self._watching = False
        self._fetched = {}  # id(cache) -> (fetch id, cache) since the last message
        self._stepping = False  # the followers wait in a collective now
        self._sleep = 0.0
        self._next_ping = 0.0

    def add(self, *op):
        self.ops.append(list(op))

    def fetched(self, prompt, usable, cache):
        """Record a prefix-cache hit; ``cache_ref(cache)`` names it in the insert."""
        fid = len(self._fetched)
        self._fetched[id(cache)] = (fid, cache)
        self.add("fetch", fid, [int(t) for t in prompt], usable)

    def cache_ref(self, cache):
        return None if cache is None else self._fetched[id(cache)][0]

    def send(self, step, shutdown=False):
        """Broadcast the ops; ``step``: every rank runs one ``next()`` right after."""
        if not self._watching:
            self.guard.__enter__()
            self._watching = True
        if shutdown:
            self.add("shutdown")
        if step:
            sleep = 0.0
        else:
            sleep = IDLE_SLEEP_MIN if self._stepping else min(IDLE_SLEEP_MAX, 2 * self._sleep)
        msg = {"ops": self.ops, "step": step, "sleep": sleep}
        self.ops, self._fetched = [], {}
        broadcast(json.dumps(msg, separators=(",", ":")).encode(), self.group)
        self.guard.tick()
        self._stepping, self._sleep = step, sleep
        self._next_ping = time.monotonic() + sleep

    def until_ping(self):
        """Seconds until the idle followers expect the next message (0: now)."""
        return 0.0 if self._stepping else max(0.0, self._next_ping - time.monotonic())

    def ping(self):
        """Send an idle message when one is due (the followers are waiting for it)."""
        if self.until_ping() == 0.0:
            self.send(step=False)

    def close(self):
        """Stop the watchdog (no collective follows)."""
        if self._watching:
            self.guard.__exit__(None, None, None)
            self._watching = False


class ReplayGenerator:
    """Rank 0's generator: a :class:`SharedTokensGenerator` whose calls are recorded.

    Offers what the engine uses of ``BatchGenerator``: ``insert_requests``, ``remove``, ``next``,
    ``close`` and ``prompt_cache_nbytes``. An op is recorded after the call succeeded.
    """

    def __init__(self, model, group, recorder, **options):
        self.inner = SharedTokensGenerator(model, group, **options)
        self.recorder = recorder
        recorder.add("reset", options)

    def insert_requests(self, requests):
        """Insert :class:`~..sched.request.Request`\\ s and record what the followers'
        rows need (:func:`replayed_row`): sampling is rank 0's alone (its tokens are
        shared), so samplers and logits processors are not sent."""
        # Slot 0 is the base model, the only one a distributed server serves (its
        # startup refuses adapters), so no other slot can reach here.
        if any(r.adapter not in (None, 0) for r in requests):
            raise ValueError("adapters are not supported with --distributed")
        uids = self.inner.insert_requests(requests)
        self.recorder.add("insert", uids, [replayed_row(r, self.recorder.cache_ref(r.cache))
                                           for r in requests])
        return uids

    def remove(self, uids, return_prompt_caches=False):
        out = self.inner.remove(uids, return_prompt_caches)
        self.recorder.add("remove", [int(u) for u in uids], bool(return_prompt_caches))
        return out

    def next(self):
        self.recorder.send(step=True)
        return self.inner.next()

    def close(self):
        self.inner.close()

    @property
    def prompt_cache_nbytes(self):
        return self.inner.prompt_cache_nbytes

    @property
    def finished_nbytes(self):
        return self.inner.finished_nbytes


def replayed_row(request, cache_ref):
    """What a follower needs of rank 0's ``request`` (plain JSON): its prompt segments,
    ``max_tokens``, the tokens its cache holds (``cache_ref`` names the fetched cache,
    or None) and its stop sequences (None: the generator's)."""
    stops = request.stop_sequences
    return {"segments": [list(s) for s in request.segments], "max_tokens": request.max_tokens,
            "cached": list(request.cached_tokens), "cache": cache_ref,
            "stops": None if stops is None else [list(s) for s in stops.sequences]}


def replayed_request(row, cache):
    """The follower's :class:`Request` of a :func:`replayed_row` (``cache``: its own
    copy of the fetched prefix, or None)."""
    return Request(row["segments"], max_tokens=row["max_tokens"], cache=cache,
                   cached_tokens=row["cached"], stop_sequences=row["stops"])


class Follower:
    """A rank other than 0: applies rank 0's ops to its own generator and prefix cache.

    Its prefix cache never evicts on its own (its byte counts differ from rank 0's: each
    rank holds a different share of the KV heads); each ``store`` op says how many entries
    rank 0 kept, and the same least-recently-used order evicts the same ones.
    """

    def __init__(self, model, group):
        self.model, self.group = model, group
        self.gen = None
        self.store = LRUPromptCache(_UNBOUNDED, _UNBOUNDED)
        self._fetched = {}
        self._removed = {}  # uid -> (cache, tokens) of rows removed in this message
        self._finished = {}  # uid -> (cache, tokens) of rows finished at the last step

    def run(self, timeout=STEP_TIMEOUT):
        """Serve until rank 0 sends ``shutdown``; a lost rank 0 raises ``SystemExit``."""
        with guard_collectives(timeout, self.group) as guard:
            while True:
                msg = json.loads(broadcast(None, self.group))
                guard.tick()
                for op in msg["ops"]:
                    if op[0] == "shutdown":
                        return
                    getattr(self, "_op_" + op[0])(*op[1:])
                self._fetched, self._removed = {}, {}
                if msg["step"]:
                    _, responses = self.gen.next()
                    self._finished = {r.uid: (r.prompt_cache, r.all_tokens) for r in responses
                                      if r.finish_reason is not None and r.prompt_cache is not None}
                else:
                    time.sleep(msg["sleep"])

    def _op_reset(self, options):
        self.gen = SharedTokensGenerator(self.model, self.group, **options)
        self._finished = {}

    def _op_fetch(self, fid, prompt, usable):
        cache, rest = self.store.fetch_nearest_cache(self.model, prompt)
        if cache is None or len(prompt) - len(rest) != usable:
            got = 0 if cache is None else len(prompt) - len(rest)
            raise ReplayError(f"prefix cache hit of {got} tokens where rank 0 had {usable}")
        self._fetched[fid] = cache

    def _op_insert(self, uids, rows):
        requests = [replayed_request(row, None if row["cache"] is None
                                     else self._fetched.pop(row["cache"])) for row in rows]
        got = self.gen.insert_requests(requests)
        if got != uids:
            raise ReplayError(f"inserted rows got uids {got} where rank 0's got {uids}")

    def _op_remove(self, uids, return_caches):
        self._removed.update(self.gen.remove(uids, return_caches))

    def _op_store(self, uid, n_tokens, n_entries):
        cache, tokens = self._removed.pop(uid, None) or self._finished.pop(uid, (None, None))
        if cache is None or len(tokens) != n_tokens:
            raise ReplayError(f"row {uid}'s cache to store is missing or has a different length")
        self.store.insert_cache(self.model, tokens, cache)
        self.store.trim_to(n_sequences=n_entries)


def run_follower(model, group):
    """The main loop of a rank other than 0; returns its exit status.

    Ctrl-C (sent to every rank of a terminal's launch) is left to rank 0, which drains
    and sends ``shutdown``; SIGTERM keeps its default (the launcher's way to end a rank).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        Follower(model, group).run()
    except ReplayError as e:
        log.error("[rank %d] error: out of step with rank 0: %s", group.rank(), e)
        return 1
    except Exception as e:  # a step failed here only: rank 0 notices the lost peer
        log.exception("[rank %d] error: replaying rank 0's step failed: %s", group.rank(), e)
        return 1
    return 0
