"""One non-streamed job's whole output, for the endpoints that answer at the end."""

from .events import Delta, Failed, Finished


async def collect_text(engine, job, events):
    """``(text, finish_reason, completion_tokens)`` of ``job`` read from its ``events``
    queue; the job is cancelled when the wait ends any other way (an error, a client
    gone)."""
    text, reason, out = "", None, 0
    try:
        while reason is None:
            ev = await events.get()
            if isinstance(ev, Failed):
                raise ev.error
            if isinstance(ev, Delta):
                text += ev.text
            elif isinstance(ev, Finished):
                reason, out = ev.finish_reason, ev.completion_tokens
    except BaseException:
        engine.cancel(job)
        raise
    return text, reason, out
