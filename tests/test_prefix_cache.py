"""Prefix reuse (``LRUPromptCache``): a new prompt continues from the longest cached prefix
and gives exactly what the whole prompt gives alone, on the real SmolLM2."""

import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched.generate import generate_step
from mlx_lm_batched.models.cache import make_prompt_cache
from mlx_lm_batched.sched.prefix_cache import LRUPromptCache

NEW = 12


def run(model, prompt, cache=None, n=NEW):
    """Greedy tokens and the first step's logprobs of ``prompt`` (on ``cache`` if given)."""
    cache = cache if cache is not None else make_prompt_cache(model)
    tokens, first = [], None
    for token, logprobs in generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=cache):
        tokens.append(token)
        if first is None:
            first = np.array(logprobs)
    return tokens, first, cache


@pytest.fixture(scope="module")
def smol(float_models):
    model, tokenizer = float_models["smollm2"]
    base = corpus_prompts(tokenizer, (90,))[0]
    return model, base


@pytest.fixture(scope="module")
def stored(smol):
    """A store holding the cache of ``base`` plus its generated tokens (as mlx-lm's
    ``generate_step`` leaves it: every yielded token is in the cache)."""
    model, base = smol
    tokens, _, cache = run(model, base)
    history = base + tokens
    assert cache[0].offset == len(history)
    store = LRUPromptCache(max_size=4)
    store.insert_cache(model, history, cache)
    return store, history, tokens


def assert_continues_exactly(model, prompt, cache, rest):
    assert len(rest) >= 1 and rest == prompt[len(prompt) - len(rest):]
    got, got_first, _ = run(model, rest, cache)
    want, want_first, _ = run(model, prompt)
    assert got == want
    np.testing.assert_allclose(got_first, want_first, atol=1e-4, rtol=0)


def test_a_longer_prompt_continues_from_the_cached_prefix(smol, stored):
    model, _ = smol
    store, history, tokens = stored
    follow_up = history + [198, 504, 2506, 30]
    cache, rest = store.fetch_nearest_cache(model, follow_up)
    assert cache is not None and len(rest) == len(follow_up) - len(history)
    assert_continues_exactly(model, follow_up, cache, rest)


def test_a_diverging_prompt_reuses_the_common_prefix(smol, stored):
    model, base = smol
    store, history, _ = stored
    other = base[:50] + [504, 2506, 30, 1012, 314]
    cache, rest = store.fetch_nearest_cache(model, other)
    assert cache is not None and len(rest) == len(other) - 50
    assert_continues_exactly(model, other, cache, rest)


def test_an_exact_hit_leaves_one_token_and_the_store_is_not_changed_by_use(smol, stored):
    model, _ = smol
    store, history, _ = stored
    for _ in range(2):  # the second fetch sees the same stored cache: use works on a copy
        cache, rest = store.fetch_nearest_cache(model, history)
        assert rest == history[-1:]
        assert_continues_exactly(model, history, cache, rest)


def test_nothing_cached_for_an_unrelated_prompt_or_another_model(smol, stored):
    model, _ = smol
    store, history, _ = stored
    assert store.fetch_nearest_cache(model, [7, 8, 9]) == (None, [7, 8, 9])
    assert store.fetch_nearest_cache("another model", history)[0] is None


def test_bounds_evict_the_least_recently_used(smol):
    model, base = smol
    store = LRUPromptCache(max_size=2)
    caches = {}
    for n in (20, 30, 40):
        _, _, cache = run(model, base[-n:], n=0)  # prefill only: the cache holds the n tokens
        caches[n] = cache
    store.insert_cache(model, base[-20:], caches[20])
    store.insert_cache(model, base[-30:], caches[30])
    assert store.fetch_nearest_cache(model, base[-20:] + [5])[0] is not None  # 20 is now recent
    store.insert_cache(model, base[-40:], caches[40])
    assert len(store) == 2
    assert store.fetch_nearest_cache(model, base[-30:] + [5])[0] is None  # evicted
    assert store.fetch_nearest_cache(model, base[-20:] + [5])[0] is not None
    # Stored caches are compacted: bytes are those of the slots held, not reserved capacity.
    attn = model.layers[0].self_attn
    per_token = len(model.layers) * 2 * attn.n_kv_heads * attn.head_dim * 4  # float32 K and V
    assert store.nbytes == (20 + 40) * per_token
    store.trim_to(n_bytes=30 * per_token)  # the 40-token entry is now the least recent
    assert len(store) == 1 and store.nbytes == 20 * per_token
    assert store.fetch_nearest_cache(model, base[-20:] + [5])[0] is not None


def test_bad_arguments():
    with pytest.raises(ValueError):
        LRUPromptCache(max_size=-1)
    with pytest.raises(ValueError):
        LRUPromptCache().fetch_nearest_cache(None, [])
    with pytest.raises(ValueError, match="cache_type"):
        LRUPromptCache().insert_cache(None, [1], [], cache_type="tool")
