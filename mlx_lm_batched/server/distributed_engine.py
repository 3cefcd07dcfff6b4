"""Rank 0's engine of a tensor-parallel server (see ``replay.py`` for the protocol).

It is the plain :class:`~.engine.Engine` with its generator and prefix cache recorded:
every ``next()`` first broadcasts what changed, idle loops ping the followers on their
schedule, and the thread's end sends ``shutdown``. A step that fails is fatal here (the
other ranks may be inside the same step's collectives, or have diverged): the requests in
flight fail, one error line is printed and ``on_fatal`` (the server's shutdown) is called.
"""

import logging
import sys
import traceback

from ..parallel.group import STEP_TIMEOUT
from .engine import Engine
from .events import Failed
from .errors import APIError
from .replay import Recorder, ReplayGenerator, lost_peer

log = logging.getLogger("mlx_lm_batched.server")


class DistributedEngine(Engine):
    """:class:`Engine` on rank 0 of ``group``; the other ranks run ``replay.run_follower``.

    ``on_fatal`` is called from the engine thread when the group is lost; ``fatal``
    then holds the error line. ``timeout``: seconds without a message sent before the
    watchdog ends the process (a follower stalled).
    """

    preempts = False  # followers replay inserts and removals, not suspensions

    # What the followers' replay cannot do is refused by the capability table.
    serving_features = frozenset({"distributed_serving"})
    embeds = False  # the model spans the ranks: rank 0 cannot run it alone
    # The followers replay the whole-cache LRU's fetches and stores (``replay.py``).
    prefix_blocks = False

    def __init__(self, model, tokenizer, group, config=None, metrics=None, timeout=STEP_TIMEOUT,
                 on_fatal=None):
        self.group = group
        self.recorder = Recorder(group, timeout)
        super().__init__(model, tokenizer, config, metrics, on_fatal=on_fatal)

    def _new_generator(self):
        return ReplayGenerator(self.model, self.group, self.recorder, **self.generator_options())

    def _fetch_prefix(self, prompt, adapter=0):
        cache, rest = super()._fetch_prefix(prompt, adapter)
        if cache is not None:
            self.recorder.fetched(prompt, len(prompt) - len(rest), cache)
        return cache, rest

    def _store_prefix(self, uid, tokens, cache, adapter=0):
        if self.config.prompt_cache_size and tokens:
            super()._store_prefix(uid, tokens, cache, adapter)
            self.recorder.add("store", int(uid), len(tokens), len(self.prefix))

    def _idle_wait(self):
        return self.recorder.until_ping()

    def _idle(self):
        self.recorder.ping()

    def _step_failed(self):
        exc = sys.exc_info()[1]
        if lost_peer(exc):
            line = f"[rank 0] error: lost a peer of the distributed group ({exc}); stopping"
        else:
            log.error("generation step failed:\n%s", traceback.format_exc())
            line = (f"[rank 0] error: a generation step failed ({type(exc).__name__}: {exc}); "
                    "the ranks may no longer agree, so the server stops")
        print(line, file=sys.stderr, flush=True)
        self.fatal = line
        self._stopping = True
        self.recorder.close()
        self._fail_all(line.split("error: ", 1)[1])
        if self.on_fatal is not None:
            self.on_fatal()

    def _closing(self):
        if self.fatal is not None:  # requests queued behind the failed step get the error
            while not self._commands.empty():
                cmd, job = self._commands.get_nowait()
                if cmd == "submit":
                    self._end_job(job)
                    job.send(Failed(APIError(503, self.fatal, None, "server_stopping")))
        if self.fatal is None:
            try:
                self.recorder.send(step=False, shutdown=True)
            except RuntimeError as e:  # a follower died while the server stopped
                self.fatal = f"[rank 0] error: lost a peer of the distributed group ({e})"
                print(self.fatal, file=sys.stderr, flush=True)
        self.recorder.close()
