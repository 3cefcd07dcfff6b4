"""Speculative decoding for one prompt: ``speculative_generate_step``, drop-in for
mlx-lm's, on the batch machinery of ``engine/speculative.py`` (a batch of one row)."""

import mlx.core as mx

from ..cache.factory import make_prompt_cache
from ..engine.batch_engine import BatchEngine
from ..engine.sampling import SharedSampling
from ..engine.speculative import SpeculativeEngine, check_num_draft_tokens, make_drafter
from ..models.context import model_vocab_size
from ..sched import capabilities
from . import validation as V
from .device import on_stream


def speculative_generate_step(
    prompt,
    model,
    draft_model=None,
    *,
    num_draft_tokens=2,
    max_tokens=256,
    sampler=None,
    logits_processors=None,
    prompt_cache=None,
    prefill_step_size=512,
    kv_bits=None,
    kv_group_size=64,
    quantized_kv_start=0,
    prompt_lookup=False,
    stream=None,
):
    """Yield ``(token, logprobs (V,), from_draft)`` for one prompt ``(L,)``, as mlx-lm's.

    The ``draft_model`` (same tokenizer) proposes ``num_draft_tokens`` tokens; ``model``
    checks them in one call. Greedy decoding yields exactly ``generate_step``'s tokens;
    a ``make_sampler`` sampler's tokens follow ``model``'s distribution (rejection
    sampling). ``prompt_lookup=True`` drafts from n-grams of the prompt and the output
    instead of a draft model. ``prompt_cache`` (mlx-lm's layout): the model's layer
    caches followed by the draft model's. Raises ``NotImplementedError`` for
    ``logits_processors`` and ``kv_bits``. ``stream``: the MLX stream the models run on.
    """
    # Always speculative, drafting from draft_model or prompt_lookup (make_drafter checks).
    capabilities.check({"speculative"} | capabilities.speculative_features(
        draft_model, prompt_lookup) | ({"kv_bits"} if kv_bits is not None else set())
        | ({"logits_processors"} if logits_processors else set()))
    num_draft_tokens = check_num_draft_tokens(num_draft_tokens)
    max_tokens = V.check_int("max_tokens", max_tokens, 0, allow=(-1,))
    prefill_step_size = V.check_int("prefill_step_size", prefill_step_size, 1)
    V.check_callable("sampler", sampler)
    prompt = V.prompt_array(prompt, model_vocab_size(model))
    if prompt.ndim != 1:
        raise ValueError(f"speculative_generate_step takes one prompt (L,), got shape "
                         f"{tuple(prompt.shape)}: use batch_generate(draft_model=...) for several")
    target_cache = draft_cache = None
    if prompt_cache is not None:
        layers = len(make_prompt_cache(model))
        target_cache, draft_cache = prompt_cache[:layers], prompt_cache[layers:]
        if draft_model is not None and not len(draft_cache):
            raise ValueError("prompt_cache holds only the model's layers: with draft_model it "
                             "needs the draft model's caches after them (mlx-lm's layout)")
    start = V.cached_tokens(target_cache)
    max_tokens = V.cap_max_tokens(model, max_tokens, prompt.size, start)
    drafter = make_drafter(draft_model, prompt_lookup, draft_cache or None,
                           prefill_step_size=prefill_step_size)
    target = BatchEngine(model, target_cache, prefill_step_size=prefill_step_size,
                         sampling=SharedSampling(sampler))
    engine = SpeculativeEngine(target, drafter, num_draft_tokens)
    if max_tokens > 0:
        engine.reserve(max_tokens)
    with on_stream(stream):
        y, logprobs, kept = engine.prefill(prompt[None])
    n = 0
    while n != max_tokens:
        for token, lp in kept[0]:
            yield token, lp, True
            n += 1
            if n == max_tokens:
                return
        yield y.item(), logprobs[0], False
        n += 1
        if n == max_tokens:
            return
        with on_stream(stream):
            y, logprobs, kept = engine.step(y)
            mx.async_eval(logprobs)
