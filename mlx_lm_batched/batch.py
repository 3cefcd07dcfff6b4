"""Many prompts at once: ``batch_generate`` and its streaming form.

Prompts are sorted by length and cut into batches of ``completion_batch_size`` so
rows of similar length share a batch (less padding). Each row stops on its own EOS
or ``max_tokens``; finished rows are dropped from the batch (so they stop costing
compute) once the steps they would still cost outweigh the copy of the caches.
"""

import time

import mlx.core as mx

from . import validation as V
from .batch_scheduled import (
    check_prompt_caches,
    needs_scheduler,
    per_row_lists,
    row_samplers,
    stream_scheduled,
)
from .batching import BatchEngine, left_pad
from .row_caches import cache_length
from .text_stops import check_stops, cut_at_stop
from .generate import BatchResponse, BatchStats, BatchStreamResponse, _as_wrapper
from .tokenizer_utils import encode_prompt

# Keywords batch_generate passes on to stream_batch_generate (mlx-lm's BatchGenerator's).
BATCH_KWARGS = ("sampler", "logits_processors", "completion_batch_size", "prefill_step_size",
                "max_kv_size", "prefill_batch_size", "stream", "stop", "seeds")


def encode_prompts(tokenizer, prompts, vocab=None):
    """Token lists for prompts given as strings or token ids.

    Raises (naming the prompt index) for empty prompts, non-integer ids
    (``TypeError``) and ids outside ``[0, vocab)`` (``ValueError``).
    """
    encoded = []
    for i, p in enumerate(V.prompt_list(prompts)):
        ids = encode_prompt(tokenizer, p) if isinstance(p, str) else p
        encoded.append(V.token_list(ids, vocab, f"prompt {i}"))
    return encoded


def _row_limits(model, encoded, max_tokens, cached=None):
    """Per-prompt ``max_tokens``, each cut to the model's context (one warning for all);
    ``cached[i]`` tokens already in prompt ``i``'s cache count against the context."""
    limits = V.per_row_max_tokens(max_tokens, len(encoded))
    cut = []
    for i, ids in enumerate(encoded):
        room = V.context_room(model, len(ids) + (cached[i] if cached else 0))
        if room is not None and room < 1:
            V.cap_max_tokens(model, limits[i], len(ids), what=f"prompt {i}")  # raises
        if room is not None and limits[i] > room:
            limits[i] = room
            cut.append(i)
    if cut:
        V.warn_context(f"max_tokens cut to fit the model's context "
                       f"({V.model_context(model)} tokens) for {len(cut)} prompt(s): "
                       f"{', '.join(map(str, cut[:8]))}{' ...' if len(cut) > 8 else ''}")
    return limits


def stream_batch_generate(
    model,
    tokenizer,
    prompts,
    max_tokens=128,
    sampler=None,
    logits_processors=None,
    completion_batch_size=32,
    prefill_step_size=2048,
    max_kv_size=None,
    stats=None,
    logprobs=True,
    prefill_batch_size=None,
    stream=None,
    prompt_caches=None,
    stop=None,
    seeds=None,
):
    """Yield a :class:`BatchStreamResponse` per row per generated token.

    ``prompts``: strings or token lists; ``max_tokens``: int or one per prompt.
    ``index`` says which prompt a response belongs to; each row's ``text`` pieces
    come from its own streaming detokenizer, so they never split a character.
    Pass a :class:`BatchStats` as ``stats`` to collect timings. ``logprobs=False``
    leaves ``logprob`` None, which spares greedy decoding a log-softmax per step.

    Everything is checked before any row is computed: a bad prompt (empty,
    non-integer or out-of-vocabulary ids) raises naming its index; sizes are ints
    >= 1 (``TypeError`` / ``ValueError``). A row whose prompt + ``max_tokens``
    passes the model's context gets ``max_tokens`` cut to fit, with one
    ``ContextLengthWarning`` for the call. ``prefill_batch_size`` (mlx-lm's) is
    accepted and checked; prefill groups here are planned from the prompt lengths.
    ``stream`` raises ``NotImplementedError``. Unknown keywords raise ``TypeError``.

    Per-row options (these run on :class:`BatchGenerator`; calls without them run
    as static batches, which are faster):

    - ``prompt_caches``: one prompt cache (or None) per prompt, e.g. ``BatchResponse.caches``
      of an earlier call; each prompt continues its cache. The caches are not modified.
    - ``sampler``: also a list with one sampler per prompt, or a ``make_sampler`` sampler
      with one setting per prompt (``make_sampler(temp=[0.0, 0.8, ...])``).
    - ``logits_processors``: also one list of processors per prompt.
    - ``stop``: stop strings, a string or list shared by all prompts or one per prompt,
      matched on the detokenized text; the stop text is not output and the row ends
      with ``finish_reason`` "stop".
    - ``seeds``: one int (or None) per prompt: the row samples from its own key
      stream, so its tokens do not depend on its batch mates (samplers must come
      from ``make_sampler``).
    """
    for response, _ in _stream(model, tokenizer, prompts, max_tokens, sampler, logits_processors,
                               completion_batch_size, prefill_step_size, max_kv_size, stats,
                               logprobs, prefill_batch_size, stream, prompt_caches, stop, seeds):
        yield response


def _stream(model, tokenizer, prompts, max_tokens, sampler, logits_processors,
            completion_batch_size, prefill_step_size, max_kv_size, stats, logprobs,
            prefill_batch_size, stream, prompt_caches, stop, seeds, want_caches=False):
    """:func:`stream_batch_generate` yielding ``(response, cache or None)`` pairs."""
    if stream is not None:
        raise NotImplementedError("stream= is not supported: choose the device with "
                                  "mx.set_default_device before the call")
    completion_batch_size = V.check_int("completion_batch_size", completion_batch_size, 1)
    prefill_step_size = V.check_int("prefill_step_size", prefill_step_size, 1)
    prefill_batch_size = V.check_optional_int("prefill_batch_size", prefill_batch_size, 1)
    max_kv_size = V.check_optional_int("max_kv_size", max_kv_size, 1, V.INT32_MAX)
    if not isinstance(sampler, (list, tuple)):
        V.check_callable("sampler", sampler)
    if per_row_lists(logits_processors):
        logits_processors = [V.check_processors(p) for p in logits_processors]
    else:
        logits_processors = V.check_processors(logits_processors)
    if stats is not None and not isinstance(stats, BatchStats):
        raise TypeError(f"stats must be a BatchStats or None, got {type(stats).__name__}")
    tokenizer = _as_wrapper(tokenizer)
    encoded = encode_prompts(tokenizer, prompts, V.model_vocab_size(model))
    n = len(encoded)
    prompt_caches = check_prompt_caches(prompt_caches, n)
    stops = check_stops(stop, n)
    seeds = _check_seeds(seeds, n)
    cached = [cache_length(c) for c in prompt_caches] if prompt_caches else None
    limits = _row_limits(model, encoded, max_tokens, cached)
    stats = stats if stats is not None else BatchStats()
    if needs_scheduler(prompt_caches, want_caches, sampler, logits_processors, stops, seeds):
        if per_row_lists(logits_processors) and len(logits_processors) != n:
            raise ValueError(f"logits_processors must have one list per prompt: expected {n}, "
                             f"got {len(logits_processors)}")
        yield from stream_scheduled(
            model, tokenizer, encoded, limits, list(range(n)), prompt_caches=prompt_caches,
            samplers=row_samplers(sampler, n), logits_processors=logits_processors, stops=stops,
            seeds=seeds, completion_batch_size=completion_batch_size,
            prefill_step_size=prefill_step_size, prefill_batch_size=prefill_batch_size,
            max_kv_size=max_kv_size, stats=stats, want_logprobs=logprobs, want_caches=want_caches)
        return
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    size = completion_batch_size
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        for response in _run_batch(
            model, tokenizer, [encoded[i] for i in rows], rows, [limits[i] for i in rows],
            sampler, logits_processors, prefill_step_size, max_kv_size, stats, logprobs,
        ):
            yield response, None


def _check_seeds(seeds, n):
    """None, or one int in [0, 2**64) or None per prompt."""
    if seeds is None:
        return None
    if not isinstance(seeds, (list, tuple)) or len(seeds) != n:
        raise ValueError(f"seeds must be a list with one seed (int or None) per prompt ({n}), "
                         f"got {seeds!r:.80}")
    for i, s in enumerate(seeds):
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**64):
            raise ValueError(f"seeds[{i}] must be an integer in [0, 2**64) or None, got {s!r}")
    return list(seeds)


def _chosen(logprobs, tokens):
    """Log-probability of each row's token, or None when not computed."""
    if logprobs is None:
        return None
    return mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


def _run_batch(model, tokenizer, prompts, indices, limits, sampler, processors,
               prefill_step_size, max_kv_size, stats, want_logprobs=True):
    eos = tokenizer.eos_token_ids
    tic = time.perf_counter()
    tokens, padding = left_pad(prompts)
    engine = BatchEngine(model, sampler, processors, None, max_kv_size, prefill_step_size)
    engine.want_logprobs = want_logprobs
    engine.reserve(max(limits))
    y, logprobs = engine.prefill(tokens, padding)
    chosen = _chosen(logprobs, y)
    mx.eval(y, chosen)
    stats.prompt_time += time.perf_counter() - tic
    stats.prompt_tokens += sum(len(p) for p in prompts)
    stats.padding_tokens += sum(padding)
    tic = time.perf_counter()

    live = list(range(len(prompts)))  # batch row -> position in this batch
    done = [False] * len(prompts)
    counts = [0] * len(prompts)
    detokenizers = [tokenizer.make_detokenizer() for _ in prompts]
    while live:
        # Queue the next step before reading this one (the device works while the
        # rows are detokenized), unless every row ends with this token anyway.
        next_y = next_chosen = None
        if any(counts[j] + 1 < limits[j] for j in live if not done[j]):
            next_y, next_logprobs = engine.step(y)
            next_chosen = _chosen(next_logprobs, next_y)
            mx.async_eval(next_y, next_chosen)
        lps = chosen.tolist() if chosen is not None else [None] * len(live)
        for row, (token, lp) in enumerate(zip(y.tolist(), lps)):
            j = live[row]
            if done[j]:
                continue
            stats.generation_tokens += 1
            finish = None
            if token in eos:
                finish = "stop"
            else:
                detokenizers[j].add_token(token)
                counts[j] += 1
                if counts[j] >= limits[j]:
                    finish = "length"
            if finish is not None:
                done[j] = True
                detokenizers[j].finalize()
            yield BatchStreamResponse(indices[j], token, detokenizers[j].last_segment, lp, finish)
        finished_rows = [r for r, j in enumerate(live) if done[j]]
        if len(finished_rows) == len(live):
            break
        # Dropping rows copies the caches (about one step's work); it pays once the
        # row-steps it saves reach a step of the whole batch.
        remaining = max(limits[j] - counts[j] for j in live if not done[j])
        if finished_rows and len(finished_rows) * remaining >= len(live):
            keep = [r for r, j in enumerate(live) if not done[j]]
            engine.filter(keep)
            idx = mx.array(keep, dtype=mx.int32)
            next_y = next_y[idx]
            next_chosen = None if next_chosen is None else next_chosen[idx]
            live = [live[r] for r in keep]
        y, chosen = next_y, next_chosen
    stats.generation_time += time.perf_counter() - tic
    stats.peak_memory = max(stats.peak_memory, mx.get_peak_memory() / 1e9)


def batch_generate(
    model,
    tokenizer,
    prompts,
    prompt_caches=None,
    max_tokens=128,
    verbose=False,
    return_prompt_caches=False,
    return_token_ids=False,
    return_logprobs=False,
    **kwargs,
):
    """Generate for every prompt at once; returns a :class:`BatchResponse`.

    ``prompts`` are strings or token lists; ``max_tokens`` an int or one per
    prompt. Texts exclude the EOS token, as mlx-lm's do. Other keyword arguments
    (``sampler``, ``logits_processors``, ``completion_batch_size``,
    ``prefill_step_size``, ``max_kv_size``, ``prefill_batch_size``, ``stop``,
    ``seeds``) go to :func:`stream_batch_generate`, which checks them and every
    prompt before any work; others raise ``TypeError`` naming them.

    ``prompt_caches``: one prompt cache (or None) per prompt to continue from, e.g.
    the ``caches`` of an earlier call (they are not modified). With
    ``return_prompt_caches=True``, ``caches`` holds one unpadded prompt cache per
    prompt (its prompt and generated tokens, the last one included), ready for a
    second turn, ``save_prompt_cache`` or ``generate_step``. A row ended by a stop
    string has the stop cut from its text; its token ids keep every generated token.
    """
    V.unknown_kwargs("batch_generate", kwargs, BATCH_KWARGS)
    prompts = V.prompt_list(prompts)
    tokenizer = _as_wrapper(tokenizer)
    n = len(prompts)
    ids = [[] for _ in range(n)]
    logprobs = [[] for _ in range(n)]
    reasons = [None] * n
    stats = BatchStats()
    caches = [None] * n
    options = {k: kwargs.get(k) for k in BATCH_KWARGS}
    options["completion_batch_size"] = kwargs.get("completion_batch_size", 32)
    options["prefill_step_size"] = kwargs.get("prefill_step_size", 2048)
    eos = set(tokenizer.eos_token_ids)
    finished = 0
    for r, cache in _stream(model, tokenizer, prompts, max_tokens, options["sampler"],
                            options["logits_processors"], options["completion_batch_size"],
                            options["prefill_step_size"], options["max_kv_size"], stats,
                            return_logprobs, options["prefill_batch_size"], options["stream"],
                            prompt_caches, options["stop"], options["seeds"],
                            want_caches=return_prompt_caches):
        if r.finish_reason != "stop" or r.token not in eos:  # EOS is not output
            ids[r.index].append(r.token)
            logprobs[r.index].append(r.logprob)
        if r.finish_reason is not None:
            reasons[r.index] = r.finish_reason
            caches[r.index] = cache
            finished += 1
            if verbose:
                print(f"[batch_generate] Finished processing {finished}/{n} ...", end="\r")
    texts = [tokenizer.decode(t) for t in ids]
    stops = check_stops(options["stop"], n)
    texts = [cut_at_stop(t, s) if reason == "stop" and s else t
             for t, s, reason in zip(texts, stops, reasons)]
    if verbose:
        print(f"[batch_generate] Finished processing {finished}/{n}")
        print(f"[batch_generate] Prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.3f} tokens-per-sec")
        print(f"[batch_generate] Generation: {stats.generation_tokens} tokens, "
              f"{stats.generation_tps:.3f} tokens-per-sec")
        print(f"[batch_generate] Peak memory: {stats.peak_memory:.3f} GB")
    return BatchResponse(
        texts, stats, caches if return_prompt_caches else None,
        ids if return_token_ids else None,
        logprobs if return_logprobs else None,
        reasons,
    )
