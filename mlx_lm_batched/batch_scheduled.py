"""``batch_generate`` calls with per-row state, run on :class:`BatchGenerator`.

Used for what the static batches of ``batch.py`` do not do: prompt caches in
(``prompt_caches``) and out (``return_prompt_caches``), one sampler per row (a list,
or a ``make_sampler`` with per-row settings), per-row seeds, per-row logits
processors and per-row stop strings. Yields ``(BatchStreamResponse, cache)`` pairs,
``cache`` being the row's unpadded prompt cache on its last response when asked.
"""

import time

import mlx.core as mx

from .row_caches import check_cache
from .scheduler import BatchGenerator
from .text_stops import TextStops


def check_prompt_caches(prompt_caches, n):
    """``prompt_caches`` must be None or one prompt cache (or None) per prompt."""
    if prompt_caches is None:
        return None
    if not isinstance(prompt_caches, (list, tuple)) or len(prompt_caches) != n:
        got = (len(prompt_caches) if isinstance(prompt_caches, (list, tuple))
               else type(prompt_caches).__name__)
        raise ValueError(f"prompt_caches must be a list with one prompt cache per prompt "
                         f"({n}), got {got}")
    for i, c in enumerate(prompt_caches):
        if c is not None:
            check_cache(c, f"prompt_caches[{i}]")
    return list(prompt_caches)


def row_samplers(sampler, n):
    """One sampler (or None) per row from ``sampler``: a callable shared by all, a list
    with one per prompt, or a ``make_sampler`` sampler with one setting per prompt
    (cut into one sampler per row, since rows are reordered and leave the batch)."""
    if isinstance(sampler, (list, tuple)):
        if len(sampler) != n:
            raise ValueError(f"sampler list must have one sampler per prompt: expected {n}, "
                             f"got {len(sampler)}")
        for i, s in enumerate(sampler):
            if s is not None and not callable(s):
                raise TypeError(f"sampler[{i}] must be callable, got {type(s).__name__}")
        return list(sampler)
    rows = getattr(sampler, "rows", None)
    if rows is not None:
        if rows != n:
            raise ValueError(f"sampler has per-row settings for {rows} rows but there are "
                             f"{n} prompts")
        return [sampler.select([i]) for i in range(n)]
    return [sampler] * n


def per_row_lists(logits_processors):
    """Whether ``logits_processors`` is one list of processors per prompt."""
    return (isinstance(logits_processors, (list, tuple)) and len(logits_processors) > 0
            and isinstance(logits_processors[0], (list, tuple)))


def needs_scheduler(prompt_caches, return_prompt_caches, sampler, logits_processors, stops,
                    seeds):
    """Whether a call needs per-row state (else the faster static batches serve it)."""
    per_row_processors = per_row_lists(logits_processors)
    return (prompt_caches is not None or return_prompt_caches or seeds is not None
            or isinstance(sampler, (list, tuple)) or getattr(sampler, "rows", None) is not None
            or per_row_processors or any(stops))


def stream_scheduled(model, tokenizer, encoded, limits, indices, *, prompt_caches, samplers,
                     logits_processors, stops, seeds, completion_batch_size, prefill_step_size,
                     prefill_batch_size, max_kv_size, stats, want_logprobs, want_caches):
    """Run the rows on one :class:`BatchGenerator`; yield ``(response, cache)`` pairs.

    ``logits_processors`` is a list shared by all rows or one list per row; ``stops``
    one list of stop strings per row; ``seeds`` None or one int (or None) per row.
    """
    from .generate import BatchStreamResponse  # generate.py imports batch.py, which imports this

    n = len(encoded)
    per_row = per_row_lists(logits_processors)
    gen = BatchGenerator(
        model, stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        logits_processors=None if per_row else logits_processors,
        completion_batch_size=completion_batch_size,
        prefill_batch_size=prefill_batch_size or 8, prefill_step_size=prefill_step_size,
        max_kv_size=max_kv_size)
    uids = gen.insert(encoded, limits, caches=prompt_caches, samplers=samplers,
                      logits_processors=[list(p) for p in logits_processors] if per_row else None,
                      seeds=seeds)
    row = {uid: i for i, uid in enumerate(uids)}
    detokenizers = [tokenizer.make_detokenizer() for _ in range(n)]
    matchers = [TextStops(s) for s in stops]
    tic = time.perf_counter()
    with gen.stats() as s:
        while responses := gen.next_generated():
            for r in responses:
                i = row[r.uid]
                lp = r.logprobs[r.token].item() if want_logprobs else None
                finish, cache, text = r.finish_reason, r.prompt_cache, ""
                if finish != "stop":  # an EOS token adds no text
                    detokenizers[i].add_token(r.token)
                    if finish is not None:
                        detokenizers[i].finalize()
                    text, matched = matchers[i].feed(detokenizers[i].last_segment)
                    if matched and finish is None:  # still running: take it out
                        removed = gen.remove([r.uid], return_prompt_caches=want_caches)
                        cache = removed[r.uid][0] if want_caches else None
                    if matched:
                        finish = "stop"
                    elif finish is not None:
                        text += matchers[i].flush()
                yield (BatchStreamResponse(indices[i], r.token, text, lp, finish),
                       cache if want_caches else None)
    gen.close()
    stats.prompt_tokens += s.prompt_tokens
    stats.prompt_time += s.prompt_time
    stats.generation_tokens += s.generation_tokens
    stats.generation_time += max(0.0, time.perf_counter() - tic - s.prompt_time)
    stats.peak_memory = max(stats.peak_memory, mx.get_peak_memory() / 1e9)
