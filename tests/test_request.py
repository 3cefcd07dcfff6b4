"""``Request`` (one prompt and what shapes its row) and ``GeneratorOptions`` (a generator's
settings): each checked once when made, one line naming the problem; mlx-lm's
parallel-list ``insert`` is a thin adapter onto ``insert_requests``."""

import dataclasses
import inspect

import pytest

from conftest import corpus_prompts
from mlx_lm_batched.cache.factory import make_prompt_cache
from mlx_lm_batched.sampling.samplers import make_sampler
from mlx_lm_batched.sampling.stop_sequences import StopSequences
from mlx_lm_batched.sched.generator import BatchGenerator
from mlx_lm_batched.sched.options import DEFAULT_QUANTIZED_KV_START, GeneratorOptions
from mlx_lm_batched.sched.request import Request


def test_request_checks_and_normalizes(float_models):
    model, _ = float_models["smollm2"]
    r = Request(([1, 2], [], (3,)), stop_sequences=[[7, 8], 9])
    assert r.segments == ((1, 2), (3,)) and r.prompt == [1, 2, 3]
    assert isinstance(r.stop_sequences, StopSequences)
    m = r.stop_sequences.matcher()
    assert [m.advance(t) for t in (7, 8)] == [False, True]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.max_tokens = 3
    with pytest.raises(ValueError, match="^the request is empty: nothing to generate from$"):
        Request(([], []))
    with pytest.raises(ValueError, match="^prompt 4 is empty"):
        Request.of([], label="prompt 4")
    with pytest.raises(ValueError, match="^max_tokens of the request must be > 0, got 0$"):
        Request.of([1], max_tokens=0)
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ValueError, match="prompt_logprobs of the request must be None or"):
            Request.of([1], prompt_logprobs=bad)
    with pytest.raises(TypeError, match=r"^caches\[2\] must be a prompt cache"):
        Request.of([1], cache=["not a cache"], cache_label="caches[2]")
    cache = make_prompt_cache(model)
    assert Request.of([1], cache=cache, cached_tokens=[]).cache is cache


def test_insert_requests_is_what_insert_does(float_models):
    """The same rows through mlx-lm's parallel lists and through Requests: same tokens,
    same finish reasons (seeded sampling included)."""
    model, tok = float_models["smollm2"]
    prompts = corpus_prompts(tok, [7, 12, 5])
    sampler = make_sampler(temp=0.9, top_k=20)

    def run(insert):
        gen = BatchGenerator(model, max_tokens=5, stop_tokens=[[t] for t in tok.eos_token_ids])
        uids = insert(gen)
        out = {u: [] for u in uids}
        reasons = {}
        while responses := gen.next_generated():
            for r in responses:
                out[r.uid].append(r.token)
                if r.finish_reason:
                    reasons[r.uid] = r.finish_reason
        return [(out[u], reasons[u]) for u in uids]

    by_lists = run(lambda g: g.insert(prompts, max_tokens=[3, 5, 4],
                                      samplers=[None, sampler, sampler], seeds=[None, 1, 2]))
    by_requests = run(lambda g: g.insert_requests(
        [Request.of(prompts[0], max_tokens=3),
         Request.of(prompts[1], sampler=sampler, seed=1),
         Request.of(prompts[2], max_tokens=4, sampler=sampler, seed=2)]))
    assert by_lists == by_requests
    assert [len(t) for t, _ in by_lists] == [3, 5, 4]
    gen = BatchGenerator(model)
    with pytest.raises(TypeError, match="insert_requests takes Request objects, got list"):
        gen.insert_requests([[1, 2]])
    with pytest.raises(ValueError, match="adapters: slot 2 is not one of this model's 1"):
        gen.insert_requests([Request.of([1, 2]), Request.of([3], adapter=2)])
    with pytest.raises(ValueError, match="prompt 0's sampler cannot be seeded"):
        gen.insert_requests([Request.of([1, 2], sampler=lambda lp: lp.argmax(-1), seed=3)])
    assert gen.next() == ([], [])  # a bad request queues none of its call's requests


def test_generator_options(float_models):
    from mlx_lm.generate import generate_step

    model, _ = float_models["smollm2"]
    # The one default of quantized_kv_start is mlx-lm's.
    theirs = inspect.signature(generate_step).parameters["quantized_kv_start"]
    assert DEFAULT_QUANTIZED_KV_START == theirs.default == GeneratorOptions().quantized_kv_start
    options = GeneratorOptions(max_tokens=7, prefill_batch_size=2, completion_batch_size=4)
    gen = BatchGenerator(model, options)
    assert gen.options is options and gen.max_tokens == 7 and gen.completion_batch_size == 4
    # mlx-lm's keywords make the options, or replace fields of given ones.
    gen = BatchGenerator(model, options, max_tokens=3, prefill_step_size=64)
    assert (gen.options.max_tokens, gen.options.prefill_step_size, gen.prefill_batch_size) == \
        (3, 64, 2)
    assert options.max_tokens == 7  # the given options are not changed
    with pytest.raises(TypeError, match="unknown generator option.*: nonsense"):
        BatchGenerator(model, nonsense=1)
    with pytest.raises(TypeError, match="options must be a GeneratorOptions, got dict"):
        BatchGenerator(model, {"max_tokens": 3})
    with pytest.raises(ValueError, match="^completion_batch_size must be an integer >= 1, got 0$"):
        GeneratorOptions(completion_batch_size=0)
    with pytest.raises(ValueError, match="kv_bits must be one of"):
        GeneratorOptions(kv_bits=7)
    with pytest.raises(ValueError, match="num_draft_tokens must be >= 1"):
        GeneratorOptions(prompt_lookup=True, num_draft_tokens=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_tokens = 1
