"""Taking rows out of a :class:`~.generator.BatchGenerator` and putting them back later
(a server preempting rows when KV memory runs out), with the same tokens as if they had
never left.

A decoding row is always one token ahead: the step queued by the last ``next()`` has
sampled its next token (advancing its sampler's key stream) and computed the keys of the
token before it. Suspending it reports that token (as the next ``next()`` would have), so
nothing is sampled twice, and keeps the row's own objects: its sampler (key stream), its
logits processors' token context, its stop matcher, its counts. Resuming queues the row
again with every token it holds as its prompt: prefill computes their keys (the same bits
as decoding them: a prompt's tokens do not depend on how they are chunked) and the prompt's
last token, the one reported at suspension, is fed as a decode step would feed it.
"""

from collections import deque

import mlx.core as mx

from ..engine.sampling import RowSampler
from ..engine.speculative import SpeculativeEngine


def suspend(gen, uids):
    """Take rows ``uids`` of ``gen`` out of its batches and queue; returns
    ``(responses, caches)``: ``responses``, the token each decoding row had sampled (a
    row that ends with it finishes there, as in ``next()``, and is not suspended);
    ``caches``, ``{uid: (prompt cache, tokens in it)}`` of the suspended decoding rows
    (the caller may keep their blocks for the resume; the generator drops them)."""
    responses, caches, taken = [], {}, set()
    batch = gen._decode
    if any(isinstance(b.engine, SpeculativeEngine) for b in [*gen._prefills, batch] if b):
        raise ValueError("rows of a speculative batch cannot be suspended")
    for uid in uids:
        row = gen._rows.get(uid)
        if row is None:
            continue
        where, i = gen._locate(uid)
        if where is not None and where is batch:
            response = _take_decoding(gen, batch, i, row)
            responses.append(response)
            if response.finish_reason is not None:
                continue  # it ended with the token it had sampled
            caches[uid] = (batch.extract(i, row), list(row.tokens[:-1]))
            batch.dead.add(uid)
        elif where is not None:  # in a prefill: it starts over
            where.dead.add(uid)
            # The prefill still samples a first token for every row of its group: not
            # from this row's sampler, whose key stream must wait for its resume.
            where.engine.sampling.rows[i] = RowSampler()
            row.tokens = row.tokens[: len(row.tokens) - row.done]
            row.done = 0
        taken.add(uid)
    gen._queue = deque(r for r in gen._queue if r.uid not in taken)
    for uid in taken:
        gen._suspended[uid] = gen._rows.pop(uid)
    gen._close_empty_prefills()
    if batch is not None and batch.dead:  # free the rows' memory now, not when it pays
        if batch.live:
            batch.pending = None if batch.pending is None else batch.drop_dead(batch.pending)
        else:
            gen._retire_decode()
    return responses, caches


def _take_decoding(gen, batch, i, row):
    """Report the token row ``i`` of the decode batch sampled in the queued step."""
    if batch.pending is None:
        raise RuntimeError("a decoding row without a queued step cannot be suspended")
    y, logprobs = batch.pending[:2]
    token = int(y[i].item())
    response = gen._report(batch, i, row.uid, token, None if logprobs is None else logprobs[i])
    if response.finish_reason is None and row.sampling.context is not None:
        # The step that would have fed it appends it to the processors' context.
        row.sampling.context.append(mx.array([token], dtype=mx.int32))
    return response


def resume(gen, uid, cache=None, cached_tokens=0):
    """Queue suspended row ``uid`` again, first in the queue; ``cache`` (or None) holds the
    first ``cached_tokens`` of its tokens, and the row prefills the rest."""
    full = suspended_tokens(gen, uid)
    if not 0 <= cached_tokens < len(full):
        raise ValueError(f"cached_tokens must be in [0, {len(full)}), got {cached_tokens}")
    row = gen._suspended.pop(uid)
    prompt = full[cached_tokens:]
    row.prompt, row.tokens, row.done = prompt, full[:cached_tokens], 0
    # The last token starts generation: a segment of its own, as when first inserted.
    row.boundaries = [len(prompt) - 1, len(prompt)] if len(prompt) > 1 else [len(prompt)]
    row.cache = cache
    row.cut_at_segments, row.prompt_logprobs = False, None
    gen._queue.appendleft(row)
    gen._rows[uid] = row


def suspended_tokens(gen, uid):
    """Every token of suspended row ``uid`` (prompt, earlier turns, what it generated)."""
    row = gen._suspended.get(uid)
    if row is None:
        raise KeyError(f"row {uid} is not suspended")
    return list(row.tokens) + list(row.prompt[row.done:])
