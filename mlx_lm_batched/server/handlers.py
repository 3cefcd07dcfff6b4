"""Chat and text completions from the engine: a whole JSON response, or server-sent
events (the job's life, disconnects included, is ``job_stream``'s)."""

from starlette.responses import JSONResponse

from .events import Delta, Failed
from .job_stream import start_job
from .responses import (
    SSE_DONE,
    ResponseIds,
    chat_logprobs,
    completion_logprobs,
    sse,
    usage,
)
from .tool_calls import delta_fields, message_fields


async def serve(engine, spec, kind, model_name, request):
    """Run ``spec`` (a JobSpec) on ``engine``; ``kind`` is "chat" or "text"."""
    n_choices = spec.params.n * (1 if spec.messages is not None else len(spec.prompts))
    job = await start_job(engine, spec, request, n_choices)
    ids = ResponseIds(kind, model_name)
    if spec.params.stream:
        return job.sse_response(_stream(job, ids, spec))
    return JSONResponse(_whole(ids, spec, job.started, await job.collect()))


def _whole(ids, spec, started, result):
    params = spec.params
    choices = []
    for i, (text, reason) in enumerate(zip(result.texts, result.finish_reasons)):
        entries = result.logprobs[i]
        if ids.kind == "chat":
            message = message_fields(spec.output.parser().parse(text))
            if "tool_calls" in message:
                reason = "tool_calls"
            choices.append({"index": i, "message": message, "finish_reason": reason,
                            "logprobs": chat_logprobs(entries) if params.logprobs else None})
        else:
            choices.append({"index": i, "text": text, "finish_reason": reason,
                            "logprobs": completion_logprobs(entries) if params.logprobs else None})
    return ids.envelope(choices, usage=usage(started.prompt_tokens, result.completion_tokens,
                                             started.cached_tokens))


async def _stream(job, ids, spec):
    """Server-sent events of one job (``job.sse_response`` cancels it unless it ended)."""
    params, chat, n, started = spec.params, ids.kind == "chat", job.n_choices, job.started
    # Chat chunks carry ``usage: null`` before the last (OpenAI's schema allows it there);
    # text-completion chunks leave it out (their schema has no null usage).
    extra = {"usage": None} if params.include_usage and chat else {}
    parsers = [spec.output.parser(stream_calls=True) for _ in range(n)] if chat else None
    offsets = [0] * n  # text offsets (completions logprobs)
    completion = 0
    if chat:
        first = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for i in range(n)]
        yield sse(ids.envelope(first, chunk=True, **extra))
    async for ev in job.events():
        if isinstance(ev, Failed):
            yield sse(ev.error.body())
            break
        if isinstance(ev, Delta):
            choice = _delta_choice(ev, chat, parsers, offsets, params.logprobs, final=False)
            if choice is not None:
                yield sse(ids.envelope([choice], chunk=True, **extra))
            continue
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
    yield SSE_DONE


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
