"""The command line's run turned into what the batch loop runs: the generator's
:class:`~..sched.options.GeneratorOptions` from the run's settings and one
:class:`~..sched.request.Request` per prompt (together a
:class:`~..api.batch_plan.BatchPlan`, which ``api.batch.stream_batch_plan`` runs).

The prompts were tokenized, checked against the context and their ``max_tokens`` capped
by ``model.tokenize_prompts``; the settings were checked by ``args.check_args``."""

from ..api import validation as V
from ..api.batch_plan import BatchPlan
from ..api.batch_args import row_constraints
from ..models.context import model_vocab_size
from ..sched.options import GeneratorOptions
from ..sched.request import Request
from ..tokenization.tokenizer import wrap_tokenizer
from .model import prefill_step


def generate_plan(args, model, tokenizer, prompts, limits, sampler, prefix=None, draft=None):
    """The :class:`BatchPlan` of the run ``args`` (a ``RunConfig``) for token
    ``prompts`` (see :func:`prompt_requests`, :func:`generator_options`); no stop
    strings: the stop tokens are the tokenizer's, set from the run's flags. The prefill
    chunk is ``--prefill-step-size`` or ``model.prefill_step``'s default for the rows
    that decode together (on a distributed group every rank agrees on it)."""
    tokenizer = wrap_tokenizer(tokenizer)
    requests = prompt_requests(args, model, tokenizer, prompts, limits, sampler, prefix)
    step = prefill_step(args, model, min(args.batch_size, len(prompts)))
    options = generator_options(args, step, draft)
    return BatchPlan(tokenizer, requests, options, [[] for _ in requests])


def generator_options(args, prefill_step_size, draft=None):
    """The generator's options for the run ``args`` (a ``RunConfig``): ``--batch-size``
    rows decode and prefill together, in chunks of ``prefill_step_size`` columns; the KV
    and speculative flags; no log-probabilities or caches come back. ``draft``: the
    loaded ``--draft-model``."""
    return GeneratorOptions(
        completion_batch_size=args.batch_size, prefill_batch_size=args.batch_size,
        prefill_step_size=prefill_step_size, max_kv_size=args.max_kv_size,
        return_logprobs=False, return_caches=False, kv_bits=args.kv_bits,
        kv_group_size=args.kv_group_size, quantized_kv_start=args.quantized_kv_start,
        draft_model=draft, num_draft_tokens=args.num_draft_tokens,
        prompt_lookup=args.prompt_lookup)


def prompt_requests(args, model, tokenizer, prompts, limits, sampler, prefix=None):
    """One request per token prompt (``tokenizer``: wrapped): ``limits[i]`` new tokens at
    most, ``sampler`` shared, ``--json-schema``'s constraint (each row its own matcher)
    and ``prefix`` (a prompt cache every prompt continues; the scheduler copies it per
    row). A token id outside the model's vocabulary raises ``ValueError``."""
    vocab = model_vocab_size(model)
    constraints = row_constraints(tokenizer, args.response_format, len(prompts))
    return [Request.of(V.token_list(ids, vocab, f"prompt {i}"), max_tokens=limits[i],
                       cache=prefix, sampler=sampler,
                       logits_processors=constraints[i] if constraints else (),
                       label=f"prompt {i}", cache_label="--prompt-cache-file")
            for i, ids in enumerate(prompts)]
