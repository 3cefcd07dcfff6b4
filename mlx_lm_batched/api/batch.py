"""Many prompts at once: ``batch_generate`` and its streaming form, on the one batch loop
(``sched.generator.BatchGenerator``) that the CLI and the server also run on.

Every prompt is known up front, so the rows go in sorted by length: the generator admits
up to ``completion_batch_size`` of them onto one engine whose prefill groups rows of
similar length (little padding), and later rows join as earlier ones finish. Each row
stops on its own EOS, stop sequence, stop string or ``max_tokens``; each row's text comes
from its own streaming detokenizer (``sched.row_text.RowText``).
"""

from ..sampling.text_stops import cut_at_stop
from ..sched.generator import BatchGenerator
from ..sched.options import GeneratorOptions
from ..sched.row_text import RowText
from ..sched.stats import BatchStats
from ..tokenization.tokenizer import wrap_tokenizer
from . import validation as V
from .batch_plan import plan_batch
from .device import wired_limit
from .responses import BatchResponse, BatchStreamResponse

# Keywords batch_generate passes on to stream_batch_generate (mlx-lm's BatchGenerator's).
BATCH_KWARGS = ("sampler", "logits_processors", "completion_batch_size", "prefill_step_size",
                "max_kv_size", "prefill_batch_size", "stream", "stop", "seeds",
                "response_format", "kv_bits", "kv_group_size", "quantized_kv_start")
# Speculative decoding keywords (BatchGenerator's; mlx-lm's names plus prompt_lookup).
SPECULATIVE_KWARGS = ("draft_model", "num_draft_tokens", "prompt_lookup")
# Keywords of stream_batch_generate beyond max_tokens and stats (each with plan_batch's
# default, batch_plan.DEFAULTS).
STREAM_KWARGS = BATCH_KWARGS + SPECULATIVE_KWARGS + ("logprobs", "prefill_batch_size",
                                                     "prompt_caches")


def stream_batch_generate(model, tokenizer, prompts, max_tokens=128, *, stats=None, **settings):
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
    ``ContextLengthWarning`` for the call. ``prefill_batch_size`` (mlx-lm's) bounds
    the rows prefilled together (default: ``completion_batch_size``); ``stream`` is the
    MLX stream the generator runs on. Unknown keywords raise ``TypeError``.

    Per-row options:

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
    - ``response_format``: an output constraint (OpenAI's ``{"type": "json_object"}`` or
      ``{"type": "json_schema", "json_schema": {"schema": {...}}}``) for every prompt,
      or a list with one (or None) per prompt. Each constrained row masks, at every
      step, the tokens its grammar forbids (``sampling/grammar.py``), so its text parses
      and validates unless ``max_tokens`` cuts it.

    ``kv_bits``/``kv_group_size``/``quantized_kv_start``: quantized KV caches with
    ``generate_step``'s meaning, for every row of the batch.

    Speculative decoding: ``draft_model`` (a smaller model with the same tokenizer) or
    ``prompt_lookup=True`` (n-gram drafts from each row's own tokens) proposes
    ``num_draft_tokens`` tokens per row and step; each row keeps its own number of
    them. Greedy rows get exactly the tokens of plain decoding, sampled rows follow
    the model's distribution (rejection sampling).
    """
    V.unknown_kwargs("stream_batch_generate", settings, STREAM_KWARGS)
    check_stats(stats)
    plan = plan_batch(model, tokenizer, prompts, dict(settings, max_tokens=max_tokens))
    yield from stream_batch_plan(model, plan, stats)


def stream_batch_plan(model, plan, stats=None):
    """Run a :class:`~.batch_plan.BatchPlan` (requests and generator options resolved
    by the caller: ``plan_batch``, or the command line's own); yields a
    :class:`BatchStreamResponse` per row per generated token, as
    :func:`stream_batch_generate` does."""
    check_stats(stats)
    for response, _ in _stream(model, plan, stats):
        yield response


def check_stats(stats):
    """``stats`` must be a :class:`BatchStats` or None (``TypeError``)."""
    if stats is not None and not isinstance(stats, BatchStats):
        raise TypeError(f"stats must be a BatchStats or None, got {type(stats).__name__}")


def _stream(model, plan, stats=None):
    """Run a :class:`BatchPlan`; yields ``(BatchStreamResponse, cache or None)`` pairs
    (the cache of a finished row when the plan's options return caches)."""
    tokenizer, requests, want_caches = plan.tokenizer, plan.requests, plan.options.return_caches
    gen = BatchGenerator(model, GeneratorOptions.of(
        plan.options, stop_tokens=[[t] for t in tokenizer.eos_token_ids]), stream=plan.stream)
    # Shortest first: the generator admits rows in this order, so rows of similar length
    # share a prefill (as static length-sorted batches would) and short ones finish first.
    order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt))
    uids = gen.insert_requests([requests[i] for i in order])
    index = dict(zip(uids, order))
    texts = {i: RowText(tokenizer, plan.stops[i]) for i in range(len(requests))}
    ended = set()  # a speculative step may report tokens of a row after its stop string
    with gen.stats() as window:
        while responses := gen.next_generated():
            for r in responses:
                if r.uid in ended:
                    continue
                i = index[r.uid]
                text, finish = texts[i].add(r.token, r.finish_reason)
                cache = r.prompt_cache
                if finish == "stop" and r.finish_reason is None:  # a stop string: leave now
                    removed = gen.remove([r.uid], return_prompt_caches=want_caches)
                    cache = removed[r.uid][0] if want_caches else None
                lp = None if r.logprobs is None else r.logprobs[r.token].item()
                if finish is not None:
                    ended.add(r.uid)
                yield BatchStreamResponse(i, r.token, text, lp, finish), cache
    gen.close()
    if stats is not None:
        stats += window


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
    ``prefill_step_size``, ``max_kv_size``, ``prefill_batch_size``, ``stream``, ``stop``,
    ``seeds``, ``response_format``, ``kv_bits``, ``kv_group_size``,
    ``quantized_kv_start``, and speculative decoding's ``draft_model``,
    ``num_draft_tokens``, ``prompt_lookup``) go to :func:`stream_batch_generate`, which
    checks them and every prompt before any work; others raise ``TypeError`` naming them.

    ``prompt_caches``: one prompt cache (or None) per prompt to continue from, e.g.
    the ``caches`` of an earlier call (they are not modified). With
    ``return_prompt_caches=True``, ``caches`` holds one unpadded prompt cache per
    prompt (its prompt and generated tokens, the last one included), ready for a
    second turn, ``save_prompt_cache`` or ``generate_step``. A row ended by a stop
    string has the stop cut from its text; its token ids keep every generated token.
    """
    V.unknown_kwargs("batch_generate", kwargs, BATCH_KWARGS + SPECULATIVE_KWARGS)
    prompts = V.prompt_list(prompts)
    tokenizer = wrap_tokenizer(tokenizer)
    n = len(prompts)
    ids = [[] for _ in range(n)]
    logprobs = [[] for _ in range(n)]
    reasons = [None] * n
    stats = BatchStats()
    caches = [None] * n
    plan = plan_batch(model, tokenizer, prompts,
                      dict(kwargs, prompt_caches=prompt_caches, max_tokens=max_tokens,
                           logprobs=return_logprobs, return_caches=return_prompt_caches))
    eos = set(tokenizer.eos_token_ids)
    finished = 0
    with wired_limit(model):  # a no-op where the device has no recommended size
        for r, cache in _stream(model, plan, stats):
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
    texts = [cut_at_stop(t, s) if reason == "stop" and s else t
             for t, s, reason in zip(texts, plan.stops, reasons)]
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
