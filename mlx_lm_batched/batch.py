"""Many prompts at once: ``batch_generate`` and its streaming form.

Prompts are sorted by length and cut into batches of ``completion_batch_size`` so
rows of similar length share a batch (less padding). Each row stops on its own EOS
or ``max_tokens``; finished rows are dropped from the batch (so they stop costing
compute) once the steps they would still cost outweigh the copy of the caches.
"""

import time

import mlx.core as mx

from . import validation as V
from .batching import BatchEngine, left_pad
from .generate import BatchResponse, BatchStats, BatchStreamResponse, _as_wrapper
from .tokenizer_utils import encode_prompt

# Keywords batch_generate passes on to stream_batch_generate (mlx-lm's BatchGenerator's).
BATCH_KWARGS = ("sampler", "logits_processors", "completion_batch_size", "prefill_step_size",
                "max_kv_size", "prefill_batch_size", "stream")


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


def _row_limits(model, encoded, max_tokens):
    """Per-prompt ``max_tokens``, each cut to the model's context (one warning for all)."""
    limits = V.per_row_max_tokens(max_tokens, len(encoded))
    cut = []
    for i, ids in enumerate(encoded):
        room = V.context_room(model, len(ids))
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
    """
    if stream is not None:
        raise NotImplementedError("stream= is not supported: choose the device with "
                                  "mx.set_default_device before the call")
    completion_batch_size = V.check_int("completion_batch_size", completion_batch_size, 1)
    prefill_step_size = V.check_int("prefill_step_size", prefill_step_size, 1)
    prefill_batch_size = V.check_optional_int("prefill_batch_size", prefill_batch_size, 1)
    max_kv_size = V.check_optional_int("max_kv_size", max_kv_size, 1, V.INT32_MAX)
    V.check_callable("sampler", sampler)
    logits_processors = V.check_processors(logits_processors)
    if stats is not None and not isinstance(stats, BatchStats):
        raise TypeError(f"stats must be a BatchStats or None, got {type(stats).__name__}")
    tokenizer = _as_wrapper(tokenizer)
    encoded = encode_prompts(tokenizer, prompts, V.model_vocab_size(model))
    limits = _row_limits(model, encoded, max_tokens)
    stats = stats if stats is not None else BatchStats()
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    size = completion_batch_size
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        yield from _run_batch(
            model, tokenizer, [encoded[i] for i in rows], rows, [limits[i] for i in rows],
            sampler, logits_processors, prefill_step_size, max_kv_size, stats, logprobs,
        )


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
    ``prefill_step_size``, ``max_kv_size``, ``prefill_batch_size``) go to
    :func:`stream_batch_generate`, which checks them and every prompt before any
    work; others raise ``TypeError`` naming them.
    """
    if prompt_caches is not None or return_prompt_caches:
        raise NotImplementedError("per-prompt caches in batch_generate are not supported yet: "
                                  "use generate_step with prompt_cache, one prompt at a time")
    V.unknown_kwargs("batch_generate", kwargs, BATCH_KWARGS)
    prompts = V.prompt_list(prompts)
    tokenizer = _as_wrapper(tokenizer)
    n = len(prompts)
    ids = [[] for _ in range(n)]
    logprobs = [[] for _ in range(n)]
    reasons = [None] * n
    stats = BatchStats()
    finished = 0
    for r in stream_batch_generate(model, tokenizer, prompts, max_tokens, stats=stats,
                                   logprobs=return_logprobs, **kwargs):
        if r.finish_reason != "stop":
            ids[r.index].append(r.token)
            logprobs[r.index].append(r.logprob)
        if r.finish_reason is not None:
            reasons[r.index] = r.finish_reason
            finished += 1
            if verbose:
                print(f"[batch_generate] Finished processing {finished}/{n} ...", end="\r")
    texts = [tokenizer.decode(t) for t in ids]
    if verbose:
        print(f"[batch_generate] Finished processing {finished}/{n}")
        print(f"[batch_generate] Prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.3f} tokens-per-sec")
        print(f"[batch_generate] Generation: {stats.generation_tokens} tokens, "
              f"{stats.generation_tps:.3f} tokens-per-sec")
        print(f"[batch_generate] Peak memory: {stats.peak_memory:.3f} GB")
    return BatchResponse(
        texts, stats, None,
        ids if return_token_ids else None,
        logprobs if return_logprobs else None,
        reasons,
    )
