"""mlx-lm 0.32's cache classes, checked against mlx-lm itself (a test oracle, never
imported by the package): ``RotatingKVCache(max_size, keep)`` (mlx-lm's ``max_kv_size``
caches keep 4 sink tokens) gives mlx-lm's results, alone and as a row of a padded batch,
and its files cross with mlx-lm's; ``ArraysCache``, ``CacheList`` and ``ChunkedKVCache``
behave as mlx-lm's, and their files cross both ways.
"""

import mlx.core as mx
import mlx_lm
import mlx_lm.models.cache as mlx_cache
import mlx_lm_batched.models.cache as our_cache
import numpy as np
import pytest
from mlx_lm.generate import generate_step as mlx_generate_step

from conftest import corpus_prompts
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.generate import generate_step
from mlx_lm_batched.models.base import create_attention_mask
from mlx_lm_batched.models.cache import (ArraysCache, CacheList, ChunkedKVCache, KVCache,
                                         RotatingKVCache,
                                         load_prompt_cache, make_prompt_cache,
                                         save_prompt_cache)

# Chunk sizes that take every path of mlx-lm's rule: a first chunk that wraps the
# ring, single tokens before and after it is full, and chunks after it has wrapped.
CHUNKS = [13, 1, 1, 5, 1, 3, 1, 1, 1, 9, 1]


def attend(q, k, v, mask):
    """Plain softmax attention under an mlx-lm mask (None, "causal" or boolean)."""
    scores = q @ k.transpose(0, 1, 3, 2)
    if isinstance(mask, str):
        L, K = q.shape[2], k.shape[2]
        mask = mx.arange(K)[None] <= (K - L + mx.arange(L))[:, None]
    if mask is not None:
        scores = mx.where(mask, scores, -1e9)
    return mx.softmax(scores, axis=-1) @ v


def test_sink_cache_and_make_mask_match_mlx_lm_attention():
    for max_size, keep in ((8, 2), (8, 0), (6, 4)):
        ours, ref = RotatingKVCache(max_size, keep=keep), mlx_cache.RotatingKVCache(max_size, keep)
        key = mx.random.key(keep)
        for L in CHUNKS:
            q, k, v = mx.random.normal((3, 1, 2, L, 4), key=key)
            key = mx.random.split(key)[0]
            ref_mask = ref.make_mask(L)  # before the write, as mlx-lm's models do
            want = attend(q, *ref.update_and_fetch(k, v), ref_mask)
            mask = ours.make_mask(L)
            api_mask = create_attention_mask(mx.zeros((3, L, 4)), ours)  # mlx-lm model code's call
            keys, values = ours.update_and_fetch(k, v)
            got = attend(q, keys, values, mask)
            assert mx.allclose(got, want, atol=1e-6).item(), (max_size, keep, ours.size)
            got = attend(q, keys, values, api_mask)
            assert mx.allclose(got, want, atol=1e-6).item(), ("api", max_size, keep, ours.size)
            if keep:  # the sinks' duplicates must be hidden: always an (L, K) array
                assert mask.shape == (L, keys.shape[2]), (mask.shape, keys.shape)
            else:  # mlx-lm's None for one query (the ring is the window)
                assert (mask is None) == (L == 1), (L, mask)


def test_max_kv_size_generation_equals_mlx_lm(float_dirs, float_models):
    # A prompt longer than the ring, generation past it, fed in mlx-lm's chunks.
    model, tokenizer = float_models["smollm2"]
    ref, _ = mlx_lm.load(str(float_dirs["smollm2"]))
    prompt = mx.array(corpus_prompts(tokenizer, (20,))[0])
    for chunk in (2048, 6):
        ref_cache = [mlx_cache.RotatingKVCache(8, keep=4) for _ in ref.layers]
        want = list(mlx_generate_step(prompt, ref, max_tokens=8, prompt_cache=ref_cache,
                                      prefill_step_size=chunk))
        got = list(generate_step(prompt, model, max_tokens=8, max_kv_size=8,
                                 prefill_step_size=chunk))
        assert [int(t) for t, _ in got] == [int(t) for t, _ in want], chunk
        worst = max(float(mx.abs(a - b).max()) for (_, a), (_, b) in zip(got, want))
        assert worst < 1e-3, (chunk, worst)


def logprobs_of_rows(model, prompts, steps):
    """Greedy log-probabilities ``(steps + 1, B, V)`` of left-padded ``prompts`` in one
    batch with ``max_kv_size=8`` caches."""
    L = max(len(p) for p in prompts)
    pad = [L - len(p) for p in prompts]
    engine = BatchEngine(model, make_prompt_cache(model, 8))
    y, lp = engine.prefill(mx.array([[0] * n + p for n, p in zip(pad, prompts)]), pad)
    out = [lp]
    for _ in range(steps):
        y, lp = engine.step(y)
        out.append(lp)
    return np.array(mx.stack(out))


def test_each_row_keeps_its_own_sinks_whatever_its_padding(float_models):
    model, tokenizer = float_models["smollm2"]
    assert make_prompt_cache(model, 8)[0].keep == 4  # mlx-lm's max_kv_size caches
    prompts = corpus_prompts(tokenizer, (14, 3, 9))  # pads of 0, 11 and 5 slots
    batch = logprobs_of_rows(model, prompts, steps=6)
    for i, prompt in enumerate(prompts):
        alone = logprobs_of_rows(model, [prompt], steps=6)[:, 0]
        assert (batch[:, i].argmax(-1) == alone.argmax(-1)).all(), i
        assert float(np.abs(batch[:, i] - alone).max()) < 1e-4, i


def feed(cache, L, key, mask_of):
    """Write ``L`` random columns into ``cache``; the attention output under its mask."""
    q, k, v = mx.random.normal((3, 1, 2, L, 4), key=key)
    mask = mask_of(cache, L)
    return attend(q, *cache.update_and_fetch(k, v), mask)


def test_sink_cache_files_cross_with_mlx_lm(tmp_path):
    ours_mask = lambda c, L: c.make_mask(L)
    for wrote, read in ((save_prompt_cache, mlx_cache.load_prompt_cache),
                        (mlx_cache.save_prompt_cache, load_prompt_cache)):
        for before in ([3], [13, 1, 1], [13, 1, 1, 5]):  # unwrapped, wrapped, after a chunk
            ours, ref = RotatingKVCache(8, keep=2), mlx_cache.RotatingKVCache(8, 2)
            key = mx.random.key(len(before))
            for L in before:
                feed(ours, L, key, ours_mask)
                feed(ref, L, key, lambda c, n: c.make_mask(n))
                key = mx.random.split(key)[0]
            path = str(tmp_path / "c.safetensors")
            wrote(path, [ours] if wrote is save_prompt_cache else [ref])
            loaded = read(path)[0]
            loaded_mask = ours_mask if read is load_prompt_cache else lambda c, n: c.make_mask(n)
            for L in (1, 4, 1):  # continue both: the same attention as the original
                want = feed(ref if read is load_prompt_cache else ours, L, key,
                            lambda c, n: c.make_mask(n))
                got = feed(loaded, L, key, loaded_mask)
                assert mx.allclose(got, want, atol=1e-6).item(), (wrote.__module__, before, L)
                key = mx.random.split(key)[0]


def test_arrays_cache_behaves_as_mlx_lms():
    conv, ssm = mx.random.normal((3, 3, 5)), mx.random.normal((3, 2, 4, 4))
    ours, ref = ArraysCache(2), mlx_cache.ArraysCache(2)
    assert ours.empty() and ref.empty()
    for c in (ours, ref):
        c[0], c[1] = conv, ssm
    assert not ours.empty() and ours.batch_size == ref.batch_size == 3
    assert ours.make_mask(4) is None and ref.make_mask(4) is None  # no padding: no mask
    for c in (ours, ref):
        c.filter(mx.array([2, 0]))
    assert all(mx.array_equal(a, b).item() for a, b in zip(ours.cache, ref.cache))
    other_ours, other_ref = ArraysCache(2), mlx_cache.ArraysCache(2)
    for c in (other_ours, other_ref):
        c[0], c[1] = conv[:1] + 1, ssm[:1] + 1
    ours.extend(other_ours)
    ref.extend(other_ref)
    assert all(mx.array_equal(a, b).item() for a, b in zip(ours.state, ref.state[0]))
    row_ours, row_ref = ours.extract(1), ref.extract(1)
    assert all(mx.array_equal(a, b).item() for a, b in zip(row_ours.cache, row_ref.cache))
    assert ours.nbytes == ref.nbytes
    ours.state = ref.state  # mlx-lm's (arrays, left_padding, lengths) state is accepted
    assert all(mx.array_equal(a, b).item() for a, b in zip(ours.cache, ref.cache))
    with pytest.raises(NotImplementedError, match="PromptCache"):
        ArraysCache(2, left_padding=[1, 0])


def test_cache_list_behaves_as_mlx_lms():
    ours = CacheList(KVCache(), RotatingKVCache(8))
    ref = mlx_cache.CacheList(mlx_cache.KVCache(), mlx_cache.RotatingKVCache(8))
    k, v = mx.random.normal((2, 2, 1, 5, 4))
    for c in (ours, ref):
        for part in c.caches:
            part.update_and_fetch(k, v)
    assert ours.is_trimmable() == ref.is_trimmable() is True
    assert ours.trim(2) == ref.trim(2) == 2
    assert [c.offset for c in ours.caches] == [c.offset for c in ref.caches] == [3, 3]
    for (s_ours, name_ours), (s_ref, name_ref) in zip(ours.state, ref.state):
        assert name_ours == name_ref
        # mlx-lm's states carry whole buffers and their counters: compare the held slots
        assert all(mx.array_equal(a, b[..., :3, :]).item() for a, b in zip(s_ours, s_ref[:2]))
    assert not ours.empty() and ours[1].max_size == 8
    ours.filter([0])
    assert ours[0].state[0].shape[0] == 1


def test_chunked_kv_cache_behaves_as_mlx_lms():
    ours, ref = ChunkedKVCache(6), mlx_cache.ChunkedKVCache(6)
    key = mx.random.key(7)
    for L in (4, 5, 1, 1, 9, 1):
        k, v = mx.random.normal((2, 1, 2, L, 4), key=key)
        key = mx.random.split(key)[0]
        for c in (ours, ref):
            c.maybe_trim_front()
        got, want = ours.update_and_fetch(k, v), ref.update_and_fetch(k, v)
        assert all(mx.array_equal(a, b).item() for a, b in zip(got, want)), L
        assert (ours.offset, ours.start_position) == (ref.offset, ref.start_position)
    assert ours.is_trimmable() and ours.trim(3) == ref.trim(3) == 3
    assert ours.offset == ref.offset
    assert all(mx.array_equal(a, b).item() for a, b in zip(ours.state, ref.keys_and_values()))


def write(cache, L, key):
    """Write ``L`` random columns into every key/value part of ``cache`` (a
    ChunkedKVCache trimmed to its chunk first, as Llama 4's layers drive it); what each
    part returns: its keys and values, or for a ring (whose slot order is each library's
    own) the attention output under its mask."""
    q, k, v = mx.random.normal((3, 2, 2, L, 4), key=key)
    if isinstance(cache, (ChunkedKVCache, mlx_cache.ChunkedKVCache)):
        cache.maybe_trim_front()
    out = []
    for part in getattr(cache, "caches", [cache]):
        if isinstance(part, (RotatingKVCache, mlx_cache.RotatingKVCache)):
            mask = part.make_mask(L)
            out.append(attend(q, *part.update_and_fetch(k, v), mask))
        elif not isinstance(part, (ArraysCache, mlx_cache.ArraysCache)):
            out.extend(part.update_and_fetch(k, v))
    return out


def make_pair(kind):
    """This package's cache of ``kind`` and mlx-lm's."""
    if kind == "chunked":
        return ChunkedKVCache(6), mlx_cache.ChunkedKVCache(6)
    parts = lambda m: (m.KVCache(), m.RotatingKVCache(8, keep=2), m.ArraysCache(2))
    ours, ref = CacheList(*parts(our_cache)), mlx_cache.CacheList(*parts(mlx_cache))
    state = list(mx.random.normal((2, 2, 3, 5), key=mx.random.key(3)))
    for c in (ours, ref):
        c[2][0], c[2][1] = state
    return ours, ref


@pytest.mark.parametrize("kind", ["chunked", "cache_list"])
def test_chunked_and_cache_list_files_cross_with_mlx_lm(tmp_path, kind):
    """A file of ``ChunkedKVCache``/``CacheList`` layers written by either library loads
    in the other with the same state: continuing it returns the keys and values the
    original returns (a wrapped sink ring, a trimmed chunk, recurrent arrays included)."""
    for wrote, read in ((save_prompt_cache, mlx_cache.load_prompt_cache),
                        (mlx_cache.save_prompt_cache, load_prompt_cache),
                        (save_prompt_cache, load_prompt_cache)):
        ours, ref = make_pair(kind)
        key = mx.random.key(5)
        for L in (4, 5, 1, 1):  # past the chunk size and the ring: trims and wraps
            write(ours, L, key)
            write(ref, L, key)
            key = mx.random.split(key)[0]
        path = str(tmp_path / f"{kind}.safetensors")
        original = ours if wrote is save_prompt_cache else ref
        wrote(path, [original, original], metadata={"note": kind})
        loaded, meta = read(path, return_metadata=True)
        assert len(loaded) == 2 and meta["note"] == kind
        assert type(loaded[0]).__name__ == type(original).__name__
        if kind == "cache_list":  # the recurrent part crosses unchanged
            for a, b in zip(loaded[0][2].cache, original[2].cache):
                assert mx.array_equal(a, b).item(), wrote.__module__
        else:
            assert (loaded[0].offset, loaded[0].start_position) == (
                original.offset, original.start_position)
        for L in (1, 3):
            want, got = write(original, L, key), write(loaded[0], L, key)
            key = mx.random.split(key)[0]
            assert len(want) == len(got) == (2 if kind == "chunked" else 3)
            for w, g in zip(want, got):
                assert mx.allclose(w, g, atol=1e-6).item(), (wrote.__module__, kind, L)


def test_padded_rows_of_cache_list_layers_round_trip(tmp_path):
    """A batch whose layers are CacheLists keeps its rows' padding through a file."""
    from mlx_lm_batched.cache.prompt_cache import PromptCache

    layer = CacheList(KVCache(), KVCache())
    write(layer, 5, mx.random.key(1))
    path = str(tmp_path / "padded.safetensors")
    save_prompt_cache(path, PromptCache([layer], padding=[2, 0]))
    loaded = load_prompt_cache(path)
    assert loaded.padding == [2, 0] and loaded[0].batch_size == 2
    for a, b in zip(loaded[0][1].state, layer[1].state):
        assert mx.array_equal(a, b).item()
