"""mlx-lm 0.32's behaviours, checked through public APIs with mlx-lm itself as the oracle
on the same weights (the real SmolLM2 converted to float32). mlx-lm is a test oracle
only: the package never imports it.

The cache contract: after ``generate_step`` yields ``n`` tokens, its cache holds the
prompt and all ``n`` tokens, so the next turn continues from it; every path that hands
out a cache (``stream_generate``, ``batch_generate``'s caches, ``BatchGenerator``'s
responses, the server's prefix cache) keeps it.
"""

import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched.generate import BatchGenerator, generate_step, stream_generate
from mlx_lm_batched.models.cache import make_prompt_cache
from mlx_lm_batched.sched.prefix_cache import LRUPromptCache


@pytest.fixture(scope="module")
def smollm2(float_models):
    return float_models["smollm2"]


@pytest.fixture(scope="module")
def lm_smollm2(float_dirs):
    import mlx_lm

    return mlx_lm.load(str(float_dirs["smollm2"]))  # (model, mlx-lm's tokenizer wrapper)


def solo_logprobs(model, tokens):
    """Log-probabilities of the token after ``tokens``, from one forward pass."""
    logits = model(mx.array([tokens]))[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


def next_logprobs(model, cache, token):
    """Log-probabilities after feeding ``token`` on top of ``cache``."""
    logits = model(mx.array([[token]]), cache=cache)[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


@pytest.mark.parametrize("n", [1, 5])
def test_generate_step_cache_holds_every_yielded_token(smollm2, lm_smollm2, n):
    lm_model = lm_smollm2[0]
    from mlx_lm.generate import generate_step as lm_generate_step
    from mlx_lm.models.cache import make_prompt_cache as lm_make_cache

    model, tokenizer = smollm2
    prompt = corpus_prompts(tokenizer, (30,))[0]
    cache = make_prompt_cache(model)
    ours = [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=cache)]
    lm_cache = lm_make_cache(lm_model)
    theirs = [t for t, _ in lm_generate_step(mx.array(prompt), lm_model, max_tokens=n,
                                              prompt_cache=lm_cache)]
    assert ours == theirs
    assert cache[0].offset == lm_cache[0].offset == len(prompt) + n
    # The next turn continues from the cache: its logits are a full pass over
    # prompt + every yielded token (off by up to 6 when the last one was missing).
    follow = tokenizer.encode(" And then", add_special_tokens=False)[0]
    want = solo_logprobs(model, prompt + ours + [follow])
    np.testing.assert_allclose(next_logprobs(model, cache, follow), want, atol=1e-4)
    np.testing.assert_allclose(next_logprobs(lm_model, lm_cache, follow), want, atol=1e-3)


def test_logits_processors_see_mlx_lm_histories(smollm2, lm_smollm2):
    lm_model = lm_smollm2[0]
    from mlx_lm.generate import generate_step as lm_generate_step

    model, tokenizer = smollm2
    prompt = corpus_prompts(tokenizer, (12,))[0]

    def recorder(seen):
        def processor(history, logits):
            seen.append(np.array(history).tolist())
            return logits
        return processor

    ours, theirs = [], []
    list(generate_step(mx.array(prompt), model, max_tokens=4, logits_processors=[recorder(ours)]))
    list(lm_generate_step(mx.array(prompt), lm_model, max_tokens=4,
                          logits_processors=[recorder(theirs)]))
    assert ours == theirs
    assert [len(h) for h in ours] == [len(prompt) + k for k in range(5)]


def test_max_tokens_zero_prefills_and_yields_nothing(smollm2, lm_smollm2):
    lm_model = lm_smollm2[0]
    from mlx_lm.generate import generate_step as lm_generate_step
    from mlx_lm.models.cache import make_prompt_cache as lm_make_cache

    model, tokenizer = smollm2
    prompt = corpus_prompts(tokenizer, (20,))[0]
    cache, lm_cache = make_prompt_cache(model), lm_make_cache(lm_model)
    assert list(generate_step(mx.array(prompt), model, max_tokens=0, prompt_cache=cache)) == []
    assert list(lm_generate_step(mx.array(prompt), lm_model, max_tokens=0,
                                 prompt_cache=lm_cache)) == []
    assert cache[0].offset == lm_cache[0].offset == len(prompt)


def test_stream_generate_cache_continues(smollm2, lm_smollm2):
    lm_model, lm_tokenizer = lm_smollm2
    from mlx_lm.generate import stream_generate as lm_stream_generate
    from mlx_lm.models.cache import make_prompt_cache as lm_make_cache

    model, tokenizer = smollm2
    prompt = corpus_prompts(tokenizer, (25,))[0]
    cache, lm_cache = make_prompt_cache(model), lm_make_cache(lm_model)
    ours = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=6,
                                             prompt_cache=cache)]
    theirs = [r.token for r in lm_stream_generate(lm_model, lm_tokenizer, prompt,
                                                  max_tokens=6,
                                                  prompt_cache=lm_cache)]
    assert ours == theirs and len(ours) == 6
    assert cache[0].offset == lm_cache[0].offset == len(prompt) + 6
    follow = ours[-1]
    np.testing.assert_allclose(next_logprobs(model, cache, follow),
                               solo_logprobs(model, prompt + ours + [follow]), atol=1e-4)


def test_batch_generator_response_cache_continues(smollm2):
    model, tokenizer = smollm2
    prompts = corpus_prompts(tokenizer, (9, 31))
    gen = BatchGenerator(model, max_tokens=5)
    uids = gen.insert(prompts)
    finished = {}
    while len(finished) < 2:
        for r in gen.next_generated():
            if r.finish_reason is not None:
                finished[r.uid] = r
    gen.close()
    store = LRUPromptCache(max_size=4)  # the server keeps finished rows' caches here
    for uid, prompt in zip(uids, prompts):
        r = finished[uid]
        store.insert_cache(model, r.all_tokens, r.prompt_cache)
        cache, rest = store.fetch_nearest_cache(model, r.all_tokens + [prompt[1]])
        assert rest == [prompt[1]]
        np.testing.assert_allclose(next_logprobs(model, cache, rest[0]),
                                   solo_logprobs(model, r.all_tokens + rest), atol=1e-4)
    for uid, prompt in zip(uids, prompts):
        r = finished[uid]
        assert r.all_tokens[: len(prompt)] == prompt and len(r.all_tokens) == len(prompt) + 5
        assert r.all_tokens[-1] == r.token and r.prompt_cache[0].offset == len(r.all_tokens)
        follow = prompt[0]
        np.testing.assert_allclose(next_logprobs(model, r.prompt_cache, follow),
                                   solo_logprobs(model, r.all_tokens + [follow]), atol=1e-4)


def test_mlx_lm_generate_module_names_and_stream(smollm2, lm_smollm2):
    """``mlx_lm.generate``'s public helpers exist under the same names (defaults, the
    argument parser, wired limit, stream) and ``stream=`` runs generation on that stream
    with the same tokens as mlx-lm's."""
    import sys

    import mlx_lm.generate  # noqa: F401 (the module, not the function of the same name)

    import mlx_lm_batched.generate  # noqa: F401

    theirs, ours = sys.modules["mlx_lm.generate"], sys.modules["mlx_lm_batched.generate"]
    for name in ("DEFAULT_TEMP", "DEFAULT_TOP_P", "DEFAULT_MIN_P", "DEFAULT_TOP_K",
                 "DEFAULT_XTC_PROBABILITY", "DEFAULT_XTC_THRESHOLD", "DEFAULT_MIN_TOKENS_TO_KEEP",
                 "DEFAULT_SEED", "DEFAULT_QUANTIZED_KV_START", "DEFAULT_PREFILL_STEP_SIZE",
                 "DEFAULT_PROMPT"):
        assert getattr(ours, name) == getattr(theirs, name), name
    args = ours.setup_arg_parser().parse_args(["--temp", "0.5", "--max-tokens", "7"])
    assert (args.temp, args.max_tokens, args.top_p) == (0.5, 7, ours.DEFAULT_TOP_P)
    assert ours.setup_arg_parser().parse_args([]).max_tokens == ours.DEFAULT_MAX_TOKENS
    assert ours.str2bool("False") is False and ours.str2bool("yes") is True
    # The CPU backend reports no recommended working set: the limit stays as it is.
    assert ("max_recommended_working_set_size" in mx.device_info()) == (
        ours.maybe_set_recommended_wired_limit() is not None)

    model, (lm_model, _) = smollm2[0], lm_smollm2
    prompt = mx.array(corpus_prompts(smollm2[1], (20,))[0])
    with ours.wired_limit(model):
        mine = [t for t, _ in generate_step(prompt, model, max_tokens=6,
                                            stream=ours.generation_stream)]
    on_cpu = [t for t, _ in generate_step(prompt, model, max_tokens=6, stream=mx.cpu)]
    ref = [t for t, _ in theirs.generate_step(prompt, lm_model, max_tokens=6)]
    assert mine == on_cpu == ref
    texts = [r.text for r in stream_generate(model, smollm2[1], prompt, max_tokens=4,
                                             stream=mx.cpu)]
    assert len(texts) == 4


def test_stop_sequence_matcher_interfaces_agree_with_mlx_lm(smollm2):
    """``StopSequenceMatcher`` (mlx-lm 0.32.0/0.32.1's stateless interface) and
    ``StopSequences`` (0.32.2's) stop exactly where mlx-lm 0.32.2's automaton stops."""
    import sys

    import mlx_lm.generate  # noqa: F401

    from mlx_lm_batched.generate import StopSequenceMatcher, StopSequences, make_stop_matcher

    theirs = sys.modules["mlx_lm.generate"].StopSequences
    sequences = [(3,), (5, 6, 5), (6, 5, 7), (5, 5)]
    rng = np.random.default_rng(0)
    stream = rng.integers(3, 8, size=400).tolist()
    ref_matcher, ours = theirs(sequences).matcher(), StopSequences(sequences).matcher()
    old = StopSequenceMatcher(sequences)
    state, trie = old.make_state(), old.make_state()
    hits = 0
    for token in stream:
        expected = ref_matcher.advance(token)
        state, matched = StopSequenceMatcher.match(state, trie, token)
        assert ours.advance(token) == matched == expected
        hits += expected
    assert 20 < hits < 380  # the stream exercises both outcomes
    tokenizer = smollm2[1]
    words = tokenizer.encode(" the end", add_special_tokens=False)
    matcher = make_stop_matcher(tokenizer, [" the end"])
    state = root = matcher.make_state()
    for token in words:
        state, matched = matcher.match(state, root, token)
    assert matched and matcher.match(root, root, next(iter(tokenizer.eos_token_ids)))[1]
