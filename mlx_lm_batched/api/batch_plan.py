"""``batch_generate``'s keywords turned, once and before any work, into what the batch
loop runs: one :class:`~..sched.request.Request` per prompt, the generator's
:class:`~..sched.options.GeneratorOptions`, and each row's stop strings
(:class:`BatchPlan`)."""

from dataclasses import dataclass
from typing import Any, List

import mlx.core as mx

from ..cache.row_caches import cache_length
from ..models.context import model_vocab_size
from ..sampling.text_stops import check_stops
from ..sched.options import DEFAULT_QUANTIZED_KV_START, GeneratorOptions
from ..sched.request import Request
from ..tokenization.tokenizer import wrap_tokenizer
from . import validation as V
from .batch_args import (
    check_prompt_caches,
    check_seeds,
    encode_prompts,
    per_row_lists,
    row_constraints,
    row_limits,
    row_samplers,
)

# ``stream_batch_generate``'s keywords (after model, tokenizer, prompts; ``stats`` aside)
# and their defaults; ``return_caches`` is ``batch_generate``'s ``return_prompt_caches``.
DEFAULTS = {
    "max_tokens": 128, "sampler": None, "logits_processors": None,
    "completion_batch_size": 32, "prefill_step_size": 2048, "max_kv_size": None,
    "logprobs": True, "prefill_batch_size": None, "stream": None, "prompt_caches": None,
    "stop": None, "seeds": None, "response_format": None, "kv_bits": None,
    "kv_group_size": 64, "quantized_kv_start": DEFAULT_QUANTIZED_KV_START,
    "draft_model": None, "num_draft_tokens": 2, "prompt_lookup": False,
    "return_caches": False,
}


@dataclass(frozen=True, eq=False)
class BatchPlan:
    """One batch call, checked: its (wrapped) tokenizer, one request per prompt in the
    caller's order, the generator's options, each row's stop strings, and the MLX
    stream to run on (None: the default)."""

    tokenizer: Any
    requests: List[Request]
    options: GeneratorOptions
    stops: List[list]
    stream: Any = None


def plan_batch(model, tokenizer, prompts, settings):
    """The :class:`BatchPlan` of ``prompts`` under ``settings`` (names of ``DEFAULTS``
    -> values; missing ones take the default). Raises ``TypeError`` / ``ValueError``
    naming the first bad value or prompt; nothing has run yet."""
    V.unknown_kwargs("plan_batch", settings, DEFAULTS)
    s = {**DEFAULTS, **settings}
    options = _options(s)
    stream = s["stream"]
    if stream is not None and not isinstance(stream, (mx.Stream, mx.Device, mx.DeviceType)):
        raise TypeError(f"stream must be an mx.Stream or a device, got {type(stream).__name__}")
    sampler, processors = s["sampler"], s["logits_processors"]
    if not isinstance(sampler, (list, tuple)):
        V.check_callable("sampler", sampler)
    per_row = per_row_lists(processors)
    processors = ([V.check_processors(p) for p in processors] if per_row
                  else V.check_processors(processors))
    tokenizer = wrap_tokenizer(tokenizer)
    encoded = encode_prompts(tokenizer, prompts, model_vocab_size(model))
    n = len(encoded)
    caches = check_prompt_caches(s["prompt_caches"], n)
    stops = check_stops(s["stop"], n)
    seeds = check_seeds(s["seeds"], n) or [None] * n
    samplers = row_samplers(sampler, n)
    if per_row and len(processors) != n:
        raise ValueError(f"logits_processors must have one list per prompt: expected {n}, "
                         f"got {len(processors)}")
    processors = processors if per_row else [processors] * n
    constraints = row_constraints(tokenizer, s["response_format"], n)
    if constraints is not None:  # each constrained row gets its processor after its own
        processors = [list(p or []) + c for p, c in zip(processors, constraints)]
    limits = row_limits(model, encoded, s["max_tokens"],
                        [cache_length(c) for c in caches] if caches else None)
    caches = caches or [None] * n
    requests = [Request.of(encoded[i], max_tokens=limits[i], cache=caches[i],
                           sampler=samplers[i], logits_processors=processors[i],
                           seed=seeds[i], label=f"prompt {i}", cache_label=f"prompt_caches[{i}]")
                for i in range(n)]
    return BatchPlan(tokenizer, requests, options, stops, stream)


def _options(s):
    """The generator's options from the checked sizes, KV and speculative settings."""
    completion = V.check_int("completion_batch_size", s["completion_batch_size"], 1)
    prefill = V.check_optional_int("prefill_batch_size", s["prefill_batch_size"], 1)
    kv_bits = V.check_optional_int("kv_bits", s["kv_bits"], 1, 8)
    return GeneratorOptions(
        completion_batch_size=completion, prefill_batch_size=prefill or completion,
        prefill_step_size=V.check_int("prefill_step_size", s["prefill_step_size"], 1),
        max_kv_size=V.check_optional_int("max_kv_size", s["max_kv_size"], 1, V.INT32_MAX),
        return_logprobs=s["logprobs"], return_caches=s["return_caches"], kv_bits=kv_bits,
        kv_group_size=V.check_int("kv_group_size", s["kv_group_size"], 1),
        quantized_kv_start=V.check_int("quantized_kv_start", s["quantized_kv_start"], 0),
        draft_model=s["draft_model"], num_draft_tokens=s["num_draft_tokens"],
        prompt_lookup=s["prompt_lookup"])
