"""One request's life on the engine, shared by every generating route.

:func:`start_job` submits a spec and waits for the engine's first event (``Started``, or
``Failed`` whose error is raised, so errors found while tokenizing still get their own
HTTP status). The :class:`JobStream` it returns is then either streamed
(:meth:`JobStream.events` inside :meth:`JobStream.sse_response`) or collected whole
(:meth:`JobStream.collect`). Whichever way, a job that did not run to its end is
cancelled, and its rows leave the batch at the next step: a client that closes its
stream, or drops its connection while it waits for a whole response, stops generating.
"""

import asyncio
import time
from dataclasses import dataclass
from typing import List, Optional

from starlette.responses import StreamingResponse

from .events import Delta, Failed, Finished

# How often a request that waits (queued, or collecting a whole response) asks whether
# its client is still connected.
DISCONNECT_POLL_S = 1.0


class ClientGone(asyncio.CancelledError):
    """The client disconnected while its request waited for the engine."""


@dataclass
class Collected:
    """A whole job's output, one entry per choice."""

    texts: List[str]
    logprobs: List[list]  # the engine's entries (id, text, logprob, top) per choice
    finish_reasons: List[Optional[str]]
    completion_tokens: int


class JobStream:
    """The events of one submitted job with ``n_choices`` choices (see the module doc).

    ``started`` is the engine's ``Started`` event (prompt and cached token counts)."""

    def __init__(self, engine, job, events, started, n_choices):
        self.started = started
        self.n_choices = n_choices
        self._engine, self._job, self._events = engine, job, events
        self._finished = 0
        self._closed = False

    @property
    def complete(self):
        """True once every choice has its ``Finished`` event."""
        return self._finished >= self.n_choices

    def close(self):
        """Cancel the job unless it ran to its end (idempotent)."""
        if not self._closed:
            self._closed = True
            if not self.complete:
                self._engine.cancel(self._job)

    async def _next(self, poll):
        ev = await (self._events.get() if poll else self._events.queue.get())
        if isinstance(ev, Finished):
            self._finished += 1
        return ev

    async def events(self):
        """``Delta`` and ``Finished`` events until every choice has finished, or a
        ``Failed`` (yielded, then the iteration ends). Closes the job at its end."""
        try:
            while not self.complete:
                ev = await self._next(poll=False)
                yield ev
                if isinstance(ev, Failed):
                    return
        finally:
            self.close()

    async def collect(self):
        """The whole output (:class:`Collected`); raises a ``Failed`` event's error.
        Polls the client while it waits; the job is cancelled on any exit but its end."""
        n = self.n_choices
        out = Collected([""] * n, [[] for _ in range(n)], [None] * n, 0)
        try:
            while not self.complete:
                ev = await self._next(poll=True)
                if isinstance(ev, Failed):
                    raise ev.error
                if isinstance(ev, Delta):
                    out.texts[ev.index] += ev.text
                    out.logprobs[ev.index].extend(ev.logprobs)
                elif isinstance(ev, Finished):
                    out.finish_reasons[ev.index] = ev.finish_reason
                    out.completion_tokens += ev.completion_tokens
        finally:
            self.close()
        return out

    def sse_response(self, body):
        """A ``text/event-stream`` response sending the strings of ``body`` (an async
        iterator built on :meth:`events`); the job is closed however the stream ends
        (the client gone, an error, the last event sent)."""
        async def guarded():
            try:
                async for chunk in body:
                    yield chunk
            finally:
                self.close()

        return StreamingResponse(guarded(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})


async def start_job(engine, spec, request, n_choices=1):
    """Submit ``spec`` (a JobSpec) and wait for its first event: the :class:`JobStream`,
    or the ``Failed`` event's error raised. ``request`` (the Starlette request, or None)
    is polled so that a client gone while its request is queued cancels it."""
    events = _Events(asyncio.Queue(), request)
    job = engine.submit(spec, asyncio.get_running_loop(), events.queue)
    try:
        first = await events.get()
    except BaseException:
        engine.cancel(job)
        raise
    if isinstance(first, Failed):
        raise first.error
    return JobStream(engine, job, events, first, n_choices)


class _Events:
    """A job's event queue read with a look at the client at least every
    ``DISCONNECT_POLL_S`` (events may come faster than that: one per token)."""

    def __init__(self, queue, request):
        self.queue, self.request = queue, request
        self._check_at = time.monotonic() + DISCONNECT_POLL_S

    async def get(self):
        """The next engine event; raises :class:`ClientGone` when the client has gone away."""
        while True:
            now = time.monotonic()
            if self.request is not None and now >= self._check_at:
                self._check_at = now + DISCONNECT_POLL_S
                if await self.request.is_disconnected():
                    raise ClientGone("client disconnected")
            try:
                return await asyncio.wait_for(self.queue.get(), max(0.0, self._check_at - now))
            except asyncio.TimeoutError:
                continue
