"""mlx-lm's ``LRUPromptCache`` under its names here (``mlx_lm_batched.server`` and
``models.cache``) answers as mlx-lm's does, with mlx-lm as the oracle: the same random
inserts, fetches and trims over a small vocabulary (so prefixes, branches and evictions
collide) give the same hits, leftover tokens, sizes, bytes and per-type stats."""

import random

import mlx.core as mx
import numpy as np
import pytest


class Tagged:
    """A layer cache with mlx-lm's protocol: ``nbytes``, ``is_trimmable()``, ``trim(n)``;
    ``trimmed`` records the cuts so both stores' answers can be compared."""

    def __init__(self, tag, nbytes, trimmable):
        self.tag, self._nbytes, self.trimmable, self.trimmed = tag, nbytes, trimmable, 0

    @property
    def nbytes(self):
        return self._nbytes

    def is_trimmable(self):
        return self.trimmable

    def trim(self, n):
        self.trimmed += n
        return n


def _answer(result):
    cache, rest = result
    if cache is None:
        return None, list(rest)
    return [(c.tag, c.trimmed) for c in cache], list(rest)


@pytest.mark.parametrize("seed", range(6))
def test_lru_prompt_cache_matches_mlx_lm(seed):
    from mlx_lm.models.cache import LRUPromptCache as Theirs

    from mlx_lm_batched.models.cache import LRUPromptCache as FromModelsCache
    from mlx_lm_batched.server import LRUPromptCache as Ours

    assert FromModelsCache is Ours
    rng = random.Random(seed)
    theirs, ours = Theirs(max_size=4, max_bytes=40), Ours(max_size=4, max_bytes=40)
    models = [("m", None, None), ("other", None, None)]
    hits = 0
    for step in range(150):
        model = rng.choice(models)
        tokens = [rng.randrange(3) for _ in range(rng.randrange(0, 6))]
        op = rng.random()
        if op < 0.45:
            kind = rng.choice(["assistant", "user", "system"])
            args = (f"c{step}", rng.randrange(1, 12), rng.random() < 0.7)
            for store in (theirs, ours):
                store.insert_cache(model, list(tokens), [Tagged(*args)], cache_type=kind)
        elif op < 0.9:
            want = _answer(theirs.fetch_nearest_cache(model, list(tokens)))
            got = _answer(ours.fetch_nearest_cache(model, list(tokens)))
            assert got == want, (step, tokens)
            hits += want[0] is not None
        else:
            bound = {"n_sequences": rng.randrange(4)} if rng.random() < 0.5 else \
                {"n_bytes": rng.randrange(40)}
            theirs.trim_to(**bound)
            ours.trim_to(**bound)
        assert (len(ours), ours.nbytes, ours.stats_by_type()) == \
            (len(theirs), theirs.nbytes, theirs.stats_by_type()), step
    assert hits > 10  # the walk reached the trie's answers, not only misses


def test_lru_prompt_cache_exact_hit_on_real_kv_cache():
    """An exact hit returns a copy of the stored KVCache and no token; a longer prompt
    returns the same keys and its extra tokens."""
    from mlx_lm_batched.models.cache import KVCache
    from mlx_lm_batched.server import LRUPromptCache

    store = LRUPromptCache(max_size=2)
    cache = KVCache()
    keys = mx.arange(12, dtype=mx.float32).reshape(1, 1, 6, 2)
    cache.update_and_fetch(keys, keys + 1)
    store.insert_cache("m", [5, 6, 7, 8, 9, 10], [cache])
    hit, rest = store.fetch_nearest_cache("m", [5, 6, 7, 8, 9, 10])
    assert rest == [] and hit[0] is not cache
    k, v = hit[0].keys_and_values()
    assert np.array_equal(np.array(k), np.array(keys))
    assert np.array_equal(np.array(v), np.array(keys + 1))
    hit, rest = store.fetch_nearest_cache("m", [5, 6, 7, 8, 9, 10, 11])
    assert rest == [11] and hit[0].offset == 6
    with pytest.raises(ValueError, match="cache_type"):
        store.insert_cache("m", [1], [cache], cache_type="tool")
