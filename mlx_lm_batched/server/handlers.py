"""Serve one request from the engine: a whole JSON response, or server-sent events.

The engine sends ``Started`` (or ``Failed``) first, so errors found while tokenizing
(context length, KV memory, template) still get their own HTTP status. A client that
goes away (stream closed, or connection dropped while waiting) cancels its job, and
its rows leave the batch at the next step.
"""

import asyncio

from starlette.responses import JSONResponse, StreamingResponse

from .events import Delta, Failed, Finished
from .responses import (
    SSE_DONE,
    ResponseIds,
    chat_logprobs,
    completion_logprobs,
    sse,
    usage,
)
from .tool_calls import delta_fields, message_fields

DISCONNECT_POLL_S = 1.0


async def serve(engine, spec, kind, model_name, request):
    """Run ``spec`` (a JobSpec) on ``engine``; ``kind`` is "chat" or "text"."""
    events = asyncio.Queue()
    job = engine.submit(spec, asyncio.get_running_loop(), events)
    try:
        first = await events.get()
    except BaseException:
        engine.cancel(job)
        raise
    if isinstance(first, Failed):
        raise first.error
    ids = ResponseIds(kind, model_name)
    n_choices = spec.params.n * (1 if spec.messages is not None else len(spec.prompts))
    if spec.params.stream:
        body = _stream(engine, job, events, first, ids, n_choices, spec)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        result = await _collect(events, n_choices, request)
    except BaseException:
        engine.cancel(job)
        raise
    return JSONResponse(_whole(ids, spec, first, result))


async def _next_event(events, request):
    """The next engine event; raises CancelledError when the client has gone away."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if request is not None and await request.is_disconnected():
                raise asyncio.CancelledError("client disconnected") from None


async def _collect(events, n, request):
    texts, entries, finish, completion = [""] * n, [[] for _ in range(n)], [None] * n, 0
    while any(f is None for f in finish):
        ev = await _next_event(events, request)
        if isinstance(ev, Delta):
            texts[ev.index] += ev.text
            entries[ev.index].extend(ev.logprobs)
        elif isinstance(ev, Finished):
            finish[ev.index] = ev.finish_reason
            completion += ev.completion_tokens
        elif isinstance(ev, Failed):
            raise ev.error
    return texts, entries, finish, completion


def _whole(ids, spec, started, result):
    texts, entries, finish, completion = result
    params = spec.params
    choices = []
    for i, (text, reason) in enumerate(zip(texts, finish)):
        if ids.kind == "chat":
            message = message_fields(spec.output.parser().parse(text))
            if "tool_calls" in message:
                reason = "tool_calls"
            choices.append({"index": i, "message": message, "finish_reason": reason,
                            "logprobs": chat_logprobs(entries[i]) if params.logprobs else None})
        else:
            choices.append({"index": i, "text": text, "finish_reason": reason,
                            "logprobs": completion_logprobs(entries[i]) if params.logprobs else None})
    return ids.envelope(choices, usage=usage(started.prompt_tokens, completion, started.cached_tokens))


async def _stream(engine, job, events, started, ids, n, spec):
    """Server-sent events of one job; cancels it unless it ran to its end."""
    params, chat = spec.params, ids.kind == "chat"
    # Chat chunks carry ``usage: null`` before the last (OpenAI's schema allows it there);
    # text-completion chunks leave it out (their schema has no null usage).
    extra = {"usage": None} if params.include_usage and chat else {}
    parsers = [spec.output.parser() for _ in range(n)] if chat else None
    offsets = [0] * n  # text offsets (completions logprobs)
    done, finished, completion = False, 0, 0
    try:
        if chat:
            first = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for i in range(n)]
            yield sse(ids.envelope(first, chunk=True, **extra))
        while finished < n:
            ev = await events.get()
            if isinstance(ev, Failed):
                yield sse(ev.error.body())
                break
            if isinstance(ev, Delta):
                choice = _delta_choice(ev, chat, parsers, offsets, params.logprobs, final=False)
                if choice is not None:
                    yield sse(ids.envelope([choice], chunk=True, **extra))
                continue
            finished += 1
            completion += ev.completion_tokens
            reason = ev.finish_reason
            if parsers is not None:
                tail = _delta_choice(Delta(ev.index, "", []), chat, parsers, offsets, False, final=True)
                if tail is not None:
                    yield sse(ids.envelope([tail], chunk=True, **extra))
                if parsers[ev.index].count:
                    reason = "tool_calls"
            end = {"index": ev.index, "finish_reason": reason, "logprobs": None}
            end.update({"delta": {}} if chat else {"text": ""})
            yield sse(ids.envelope([end], chunk=True, **extra))
        else:
            if params.include_usage:
                yield sse(ids.envelope([], chunk=True, usage=usage(
                    started.prompt_tokens, completion, started.cached_tokens)))
            done = True
        yield SSE_DONE
    finally:
        if not done:
            engine.cancel(job)


def _delta_choice(ev, chat, parsers, offsets, logprobs, final):
    """The choice object of one Delta (None when there is nothing to send)."""
    i = ev.index
    if not chat:
        lp = completion_logprobs(ev.logprobs, offsets[i]) if logprobs else None
        offsets[i] += len(ev.text)
        if not ev.text and not ev.logprobs:
            return None
        return {"index": i, "text": ev.text, "logprobs": lp, "finish_reason": None}
    delta = delta_fields(parsers[i].finish() if final else parsers[i].feed(ev.text))
    if not delta and not ev.logprobs:
        return None
    return {"index": i, "delta": delta, "finish_reason": None,
            "logprobs": chat_logprobs(ev.logprobs) if logprobs and ev.logprobs else None}
