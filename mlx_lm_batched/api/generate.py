"""The single-stream generation API, drop-in for ``mlx_lm.generate``'s:
``generate_step`` (also for a left-padded ``(B, L)`` batch), ``stream_generate`` and
``generate``. Many prompts: ``api/batch.py``."""

import time

import mlx.core as mx

from ..engine.batch_engine import BatchEngine, KVQuantization
from ..engine.sampling import SharedSampling
from ..models.context import model_vocab_size
from ..sched.options import DEFAULT_QUANTIZED_KV_START
from ..sched.stats import peak_memory_gb
from ..tokenization.tokenizer import encode_prompt, wrap_tokenizer
from . import validation as V
from .device import on_stream, wired_limit
from .responses import GenerationResponse
from .speculative import speculative_generate_step


def generate_step(
    prompt,
    model,
    *,
    max_tokens=256,
    sampler=None,
    logits_processors=None,
    max_kv_size=None,
    prompt_cache=None,
    prefill_step_size=2048,
    left_padding=None,
    prompt_progress_callback=None,
    input_embeddings=None,
    kv_bits=None,
    kv_group_size=64,
    quantized_kv_start=DEFAULT_QUANTIZED_KV_START,
    stream=None,
):
    """Generate tokens for a prompt ``(L,)`` or a left-padded batch ``(B, L)``.

    A 1-D prompt keeps mlx-lm's contract: yields ``(token: int, logprobs (V,))``.
    A 2-D prompt yields ``(tokens (B,), logprobs (B, V))`` per step;
    ``left_padding`` lists the pad columns of each row. Rows never stop early
    here (``batch_generate`` handles per-row stopping). ``max_tokens=-1`` never ends.
    Logits processors see ``(B, T)`` token histories with -1 at padding (1-D
    histories for a 1-D prompt) and ``(B, V)`` logits.

    Checked before any work (see ``validation.py``): token ids in ``[0, vocab)``,
    ``left_padding`` one int per row with ``0 <= pad < L``, ``max_tokens`` an int
    >= 1 or -1, sizes >= 1. ``max_tokens`` past the model's context
    (``max_position_embeddings``) is cut to fit with one ``ContextLengthWarning``
    (with -1 the warning comes when generation crosses the context); a prompt that
    fills the context raises ``ValueError``. Raises ``TypeError`` for values of the
    wrong type. ``kv_bits`` (2, 3, 4, 5, 6 or 8) quantizes the key/value caches in
    groups of ``kv_group_size`` (32, 64, 128) once they hold ``quantized_kv_start``
    slots, as mlx-lm (``kv_group_size`` and ``quantized_kv_start`` only apply with it).
    ``stream``: the MLX stream the model runs on (default: the default stream).
    """
    # 0 prefills the prompt into the cache and yields nothing (mlx-lm's meaning).
    max_tokens = V.check_int("max_tokens", max_tokens, 0, allow=(-1,))
    prefill_step_size = V.check_int("prefill_step_size", prefill_step_size, 1)
    max_kv_size = V.check_optional_int("max_kv_size", max_kv_size, 1, V.INT32_MAX)
    kv_group_size = V.check_int("kv_group_size", kv_group_size, 1)
    quantized_kv_start = V.check_int("quantized_kv_start", quantized_kv_start, 0)
    kv_quant = KVQuantization.of(V.check_optional_int("kv_bits", kv_bits, 1, 8), kv_group_size,
                                 quantized_kv_start)
    V.check_callable("sampler", sampler)
    V.check_callable("prompt_progress_callback", prompt_progress_callback)
    logits_processors = V.check_processors(logits_processors)
    prompt = V.prompt_array(prompt, model_vocab_size(model))
    left_padding = V.left_padding_list(left_padding, 1 if prompt.ndim == 1 else prompt.shape[0],
                                       prompt.shape[-1])
    start = V.cached_tokens(prompt_cache)
    max_tokens = V.cap_max_tokens(model, max_tokens, prompt.shape[-1], start)
    room = V.context_room(model, prompt.shape[-1], start) if max_tokens == -1 else None
    single = prompt.ndim == 1
    tokens = prompt[None] if single else prompt
    processors = list(logits_processors or [])
    if single and processors:
        # mlx-lm processors take a 1-D history and (1, V) logits.
        processors = [lambda h, l, p=p: p(h[0], l) for p in processors]
    engine = BatchEngine(model, prompt_cache, max_kv_size=max_kv_size,
                         prefill_step_size=prefill_step_size,
                         sampling=SharedSampling(sampler, processors), kv_quant=kv_quant)
    if max_tokens > 0:
        engine.reserve(max_tokens)
    if single and input_embeddings is not None and input_embeddings.ndim == 2:
        input_embeddings = input_embeddings[None]
    progress = None
    if prompt_progress_callback is not None:
        total = tokens.shape[1]
        progress = lambda done, _: prompt_progress_callback(done, total)
    with on_stream(stream):
        y, logprobs = engine.prefill(tokens, left_padding, progress, input_embeddings)
        mx.async_eval(y, logprobs)
    if prompt_progress_callback is not None:
        prompt_progress_callback(tokens.shape[1], tokens.shape[1])
    n = 0
    while n != max_tokens:
        if n == room:
            V.warn_context("generation (max_tokens=-1) passed the model's context "
                           "(max_position_embeddings): later tokens are out of range")
        # Queue the next step before handing this one out, so the device works
        # while the caller detokenizes. The step runs for the last token too: as in
        # mlx-lm, the cache then holds every token yielded, so a later call continues
        # from it (and logits processors see the same histories as mlx-lm's).
        with on_stream(stream):
            next_y, next_logprobs = engine.step(y)
            mx.async_eval(next_y, next_logprobs)
        if single:
            yield y.item(), logprobs[0]
        else:
            yield y, logprobs
        y, logprobs = next_y, next_logprobs
        n += 1


def stream_generate(model, tokenizer, prompt, max_tokens=256, draft_model=None, **kwargs):
    """Yield a :class:`GenerationResponse` per generated token for one prompt.

    ``prompt`` is a string (encoded as is) or token ids. Stops at an EOS token
    (``finish_reason="stop"``) or after ``max_tokens`` (``"length"``). Other
    keyword arguments go to :func:`generate_step`, which checks them
    (``ValueError`` / ``TypeError``); ``max_tokens`` is an int >= 1 or -1 and is
    cut to the model's context with a ``ContextLengthWarning``. With ``draft_model``
    (and ``num_draft_tokens``) or ``prompt_lookup=True`` it decodes speculatively
    (:func:`~.speculative.speculative_generate_step`); ``from_draft`` marks the
    tokens a draft proposed and the model accepted.
    """
    speculative = draft_model is not None or kwargs.get("prompt_lookup")
    if not speculative:
        kwargs.pop("num_draft_tokens", None)  # mlx-lm's: ignored without a draft model
        kwargs.pop("prompt_lookup", None)
    max_tokens = V.check_max_tokens(max_tokens, allow_unlimited=True)
    tokenizer = wrap_tokenizer(tokenizer)
    if isinstance(prompt, str):
        prompt = encode_prompt(tokenizer, prompt)
    elif isinstance(prompt, bytes) or prompt is None:
        raise TypeError(f"prompt must be a string or token ids, got {type(prompt).__name__}")
    if isinstance(prompt, (list, tuple)) and len(prompt) == 0:
        raise ValueError("empty prompt: nothing to generate from")
    prompt = V.prompt_array(prompt, model_vocab_size(model))
    if prompt.ndim != 1:
        raise ValueError(f"stream_generate takes one prompt (L,), got shape {tuple(prompt.shape)}:"
                         " use batch_generate for several")
    # Cut here, not only in generate_step: the loop below must know the real limit.
    max_tokens = V.cap_max_tokens(model, max_tokens, prompt.size,
                                  V.cached_tokens(kwargs.get("prompt_cache")))
    tic = time.perf_counter()
    if speculative:
        steps = speculative_generate_step(prompt, model, draft_model, max_tokens=max_tokens,
                                          **kwargs)
    else:
        steps = ((t, lp, False) for t, lp in
                 generate_step(prompt, model, max_tokens=max_tokens, **kwargs))
    with wired_limit(model, [kwargs["stream"]] if kwargs.get("stream") is not None else None):
        yield from _responses(steps, tokenizer, prompt.size, max_tokens, tic)


def _responses(steps, tokenizer, prompt_size, max_tokens, tic):
    """``stream_generate``'s responses for the ``(token, logprobs, from_draft)`` steps."""
    detokenizer = tokenizer.make_detokenizer()
    token, logprobs, prompt_tps, n, from_draft = None, None, 0.0, 0, False
    for n, (token, logprobs, from_draft) in enumerate(steps):
        if n == 0:
            prompt_tps = prompt_size / (time.perf_counter() - tic)
            tic = time.perf_counter()
        if token in tokenizer.eos_token_ids:
            break
        detokenizer.add_token(token)
        if n + 1 == max_tokens:
            break
        yield GenerationResponse(
            detokenizer.last_segment, token, logprobs, from_draft, prompt_size, prompt_tps,
            n + 1, (n + 1) / (time.perf_counter() - tic), peak_memory_gb(),
        )
    detokenizer.finalize()
    finish = "stop" if token in tokenizer.eos_token_ids else "length"
    yield GenerationResponse(
        detokenizer.last_segment, token, logprobs, from_draft, prompt_size, prompt_tps,
        n + 1, (n + 1) / max(time.perf_counter() - tic, 1e-9), peak_memory_gb(), finish,
    )


def generate(model, tokenizer, prompt, verbose=False, **kwargs):
    """Generate the full completion of one prompt and return its text."""
    if verbose:
        print("=" * 10)
    text, response = "", None
    for response in stream_generate(model, tokenizer, prompt, **kwargs):
        if verbose:
            print(response.text, end="", flush=True)
        text += response.text
    if verbose and response is not None:
        print()
        print("=" * 10)
        if not text:
            print("No text generated for this prompt")
        print(f"Prompt: {response.prompt_tokens} tokens, {response.prompt_tps:.3f} tokens-per-sec")
        print(f"Generation: {response.generation_tokens} tokens, "
              f"{response.generation_tps:.3f} tokens-per-sec")
        print(f"Peak memory: {response.peak_memory:.3f} GB")
    return text
