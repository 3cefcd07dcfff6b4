"""Per-row state that lives with the caches: a padded batch continued by later calls
(second turns, after save/load, after trim) equals each conversation run alone;
prompt-cache files shared with mlx-lm both ways; memory that follows what is
generated."""

import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched import batch_generate, generate
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.generate import generate_step
from mlx_lm_batched.models import llama
from mlx_lm_batched.models.cache import (
    PromptCache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)


def tiny_llama(**extra):
    mx.random.seed(0)
    args = llama.ModelArgs.from_dict(dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100, **extra))
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def batched_turn(model, cache, rows, n):
    """Generate ``n`` tokens for left-padded ``rows`` on ``cache``: tokens per row
    and logprobs ``(n, B, V)``."""
    tokens, padding = left_pad(rows)
    steps = list(generate_step(tokens, model, max_tokens=n, left_padding=padding,
                               prompt_cache=cache))
    out = np.array(mx.stack([y for y, _ in steps], axis=1)).tolist()
    return out, np.array(mx.stack([lp for _, lp in steps]))


def solo_turn(model, cache, prompt, n):
    steps = list(generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=cache))
    return [t for t, _ in steps], np.array(mx.stack([lp for _, lp in steps]))


def test_padded_cache_reused_by_a_second_call_is_exact():
    # The reproduction: turn 1 a padded batch, turn 2 on the same caches.
    model = tiny_llama()
    a, b, follow = [5, 6, 7], [8, 9, 10, 11, 12, 13], [[20], [21]]
    cache = make_prompt_cache(model)
    list(generate_step(mx.array([[0] * 3 + a, b]), model, max_tokens=1, left_padding=[3, 0],
                       prompt_cache=cache))
    # Each row holds its prompt and the token generated for it (mlx-lm's cache contract).
    assert isinstance(cache, PromptCache) and cache.padding == [3, 0] and cache.lengths == [4, 7]
    _, batched = next(generate_step(mx.array(follow), model, max_tokens=1, prompt_cache=cache))
    for row, prompt in enumerate([a, b]):
        solo_cache = make_prompt_cache(model)
        list(generate_step(mx.array(prompt), model, max_tokens=1, prompt_cache=solo_cache))
        _, solo = next(generate_step(mx.array(follow[row]), model, max_tokens=1,
                                     prompt_cache=solo_cache))
        np.testing.assert_allclose(np.array(batched[row]), np.array(solo), atol=1e-5)


def conversation_check(model, first, second, n1, n2, max_kv_size=None, between=None,
                       tmp_path=None):
    """Turn 1 (``first`` prompts) then turn 2 (``second`` user turns) as one padded
    batch on one cache, against each conversation alone; ``between`` is "save"
    (save/load the caches) or "trim" (drop the last 2 slots) after turn 1."""
    def trim(cache):
        if between == "trim":
            assert trim_prompt_cache(cache, 2) == 2

    def carry_over(generated):
        # What turn 2 feeds before the user turn: nothing (the caches hold every token
        # turn 1 yielded), or the two trimmed ones when trimming.
        return generated[-2:] if between == "trim" else []

    def maybe_reload(cache, name):
        if between != "save":
            return cache
        path = str(tmp_path / f"{name}.safetensors")
        save_prompt_cache(path, cache, {"turn": "1"})
        loaded, meta = load_prompt_cache(path, return_metadata=True)
        assert meta == {"turn": "1"}
        return loaded

    cache = make_prompt_cache(model, max_kv_size)
    gen1, _ = batched_turn(model, cache, first, n1)
    cache = maybe_reload(cache, "batch")
    trim(cache)
    rows = [carry_over(g) + u for g, u in zip(gen1, second)]
    gen2, lp2 = batched_turn(model, cache, rows, n2)
    for i, (p, u) in enumerate(zip(first, second)):
        solo = make_prompt_cache(model, max_kv_size)
        s1, _ = solo_turn(model, solo, p, n1)
        assert s1 == gen1[i], f"row {i} turn 1"
        solo = maybe_reload(solo, f"row{i}")
        trim(solo)
        s2, slp2 = solo_turn(model, solo, carry_over(s1) + u, n2)
        assert s2 == gen2[i], f"row {i} turn 2"
        np.testing.assert_allclose(lp2[:, i], slp2, atol=1e-4, rtol=1e-4,
                                   err_msg=f"row {i} turn 2 logprobs")


@pytest.mark.parametrize("max_kv_size,between", [
    (None, None), (None, "save"), (None, "trim"), (9, None), (9, "save")])
def test_tiny_multi_turn(tmp_path, between, max_kv_size):
    # max_kv_size=9: rotating caches that wrap in both turns (a wrapped ring
    # cannot be trimmed: its dropped slots are gone).
    model = tiny_llama()
    rng = np.random.default_rng(3)
    first = [rng.integers(1, 100, n).tolist() for n in (4, 11, 7)]
    second = [rng.integers(1, 100, n).tolist() for n in (3, 1, 6)]
    conversation_check(model, first, second, 4, 5, max_kv_size, between, tmp_path)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
@pytest.mark.parametrize("between", [None, "save", "trim"])
def test_real_multi_turn(float_models, tmp_path, name, between):
    model, tokenizer = float_models[name]
    first = corpus_prompts(tokenizer, (14, 33, 22))
    second = [tokenizer.encode(t, add_special_tokens=False)
              for t in (" Tell me more.", " Why?", " And what did the keeper say then?")]
    conversation_check(model, first, second, 4, 4, None, between, tmp_path)


def test_gemma_second_turn_crosses_its_window(float_models):
    # Gemma 3's sliding layers keep 512 slots: row 1's second turn crosses them.
    model, tokenizer = float_models["gemma3"]
    first = corpus_prompts(tokenizer, (200, 480, 90))
    second = [corpus_prompts(tokenizer, (n,), stride=101)[0][1:] for n in (40, 30, 9)]
    conversation_check(model, first, second, 3, 3)


def test_rows_filtered_and_extended_keep_their_positions():
    # Rows of two padded batches joined into one, one row dropped: each remaining
    # row decodes as it would alone.
    model = tiny_llama()
    rng = np.random.default_rng(5)
    prompts = [rng.integers(1, 100, n).tolist() for n in (3, 9, 5, 12)]
    halves = []
    for part in (prompts[:2], prompts[2:]):
        engine = BatchEngine(model)
        tokens, padding = left_pad(part)
        y, _ = engine.prefill(tokens, padding)
        halves.append((engine, y))
    (engine, y0), (other, y1) = halves
    engine.cache.extend(other.cache)
    assert engine.cache.padding == [6 + 3, 0 + 3, 7, 0]  # the second batch is 3 slots longer
    y = mx.concatenate([y0, y1])[mx.array([1, 2, 3])]
    engine.filter([1, 2, 3])
    assert min(engine.cache.padding) == 0
    out = []
    for _ in range(4):
        y, _ = engine.step(y)
        out.append(y)
    batched = np.array(mx.stack(out, axis=1))
    for row, p in zip(batched, prompts[1:]):
        solo, _ = solo_turn(model, make_prompt_cache(model), p, 5)
        assert row.tolist() == solo[1:]


def test_plain_list_of_caches_is_unpadded():
    # mlx-lm style: a plain list of layer caches, one sequence, two calls.
    model = tiny_llama()
    cache = list(make_prompt_cache(model))
    a, _ = solo_turn(model, cache, [4, 5, 6, 7], 3)
    b, _ = solo_turn(model, cache, [a[-1], 9], 3)
    ref = make_prompt_cache(model)
    solo_turn(model, ref, [4, 5, 6, 7], 3)
    c, _ = solo_turn(model, ref, [a[-1], 9], 3)
    assert b == c


# Prompt-cache files shared with mlx-lm 0.32 (the oracle) in both directions.

def _mlx_lm_model(float_dirs):
    import mlx_lm

    model, _ = mlx_lm.load(str(float_dirs["smollm2"]))
    return model


def _mlx_lm_continue(model, cache, token, n):
    from mlx_lm.generate import generate_step as lm_step

    steps = list(lm_step(mx.array([token]), model, max_tokens=n, prompt_cache=cache))
    return [int(t) for t, _ in steps], np.array(mx.stack([lp for _, lp in steps]))


@pytest.mark.parametrize("max_kv_size", [None, 32])
def test_our_cache_file_continues_in_mlx_lm(float_models, float_dirs, tmp_path, max_kv_size):
    from mlx_lm.models.cache import load_prompt_cache as lm_load

    model, tokenizer = float_models["smollm2"]
    prompt = corpus_prompts(tokenizer, (40,))[0]
    cache = make_prompt_cache(model, max_kv_size)
    (first,), _ = solo_turn(model, cache, prompt, 1)  # the cache holds prompt + first
    path = str(tmp_path / "ours.safetensors")
    save_prompt_cache(path, cache, {"source": "mlx_lm_batched"})
    follow = prompt[5]  # the next turn's first token
    ours, our_lp = solo_turn(model, cache, [follow], 8)

    theirs_cache, meta = lm_load(path, return_metadata=True)
    assert meta == {"source": "mlx_lm_batched"}
    assert [type(c).__name__ for c in theirs_cache] == [type(c).__name__ for c in cache]
    assert theirs_cache[0].offset == len(prompt) + 1
    theirs, their_lp = _mlx_lm_continue(_mlx_lm_model(float_dirs), theirs_cache, follow, 8)
    assert theirs == ours
    np.testing.assert_allclose(their_lp, our_lp, atol=1e-3)


@pytest.mark.parametrize("kind", ["KVCache", "RotatingKVCache"])
def test_mlx_lm_cache_file_continues_here(float_models, float_dirs, tmp_path, kind):
    from mlx_lm.models import cache as lm_cache

    model, tokenizer = float_models["smollm2"]
    prompt = corpus_prompts(tokenizer, (40,))[0]
    lm_model = _mlx_lm_model(float_dirs)
    if kind == "KVCache":
        theirs = lm_cache.make_prompt_cache(lm_model)
        max_kv_size = None
    else:  # mlx-lm's max_kv_size cache: 4 sink tokens, as make_prompt_cache's here
        theirs = [lm_cache.RotatingKVCache(max_size=32, keep=4) for _ in lm_model.layers]
        max_kv_size = 32
    # mlx-lm's own model fills its cache with exactly the prompt, fed as its
    # generate_step feeds it (all but the last token, then the last alone; it would
    # also feed the first sampled token before yielding it).
    lm_model(mx.array([prompt[:-1]]), cache=theirs)
    first = int(mx.argmax(lm_model(mx.array([prompt[-1:]]), cache=theirs)[0, -1]))
    path = str(tmp_path / "theirs.safetensors")
    lm_cache.save_prompt_cache(path, theirs, {"source": "mlx_lm"})

    loaded, meta = load_prompt_cache(path, return_metadata=True)
    assert meta == {"source": "mlx_lm"} and loaded.padding is None
    assert [type(c).__name__ for c in loaded] == [kind] * len(model.layers)
    got, got_lp = solo_turn(model, loaded, [first], 8)

    ref = make_prompt_cache(model, max_kv_size)
    assert list(generate_step(mx.array(prompt), model, max_tokens=0, prompt_cache=ref)) == []
    (ref_first,), _ = solo_turn(model, make_prompt_cache(model, max_kv_size), prompt, 1)
    want, want_lp = solo_turn(model, ref, [first], 8)
    assert ref_first == first and got == want
    np.testing.assert_allclose(got_lp, want_lp, atol=1e-3)


def test_load_prompt_cache_errors(tmp_path):
    from mlx_lm.models import cache as lm_cache

    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        load_prompt_cache(str(tmp_path / "missing.safetensors"))
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"this is not a safetensors file")
    with pytest.raises(ValueError, match="corrupt.safetensors"):
        load_prompt_cache(str(corrupt))
    foreign = str(tmp_path / "weights.safetensors")
    mx.save_safetensors(foreign, {"model.norm.weight": mx.ones((4,))})
    with pytest.raises(ValueError, match="weights.safetensors.*no cache classes"):
        load_prompt_cache(foreign)
    path = str(tmp_path / "unknown.safetensors")
    mx.save_safetensors(path, {"0.0": mx.ones((2,))}, metadata={"1.0": "QuantizedFooCache"})
    with pytest.raises(ValueError, match="QuantizedFooCache"):
        load_prompt_cache(path)


# Memory follows what is generated, not max_tokens.

def force_eos_after(n, eos):
    """A logits processor that makes every row pick ``eos`` from its ``n``-th token on."""
    calls = [0]

    def processor(history, logits):
        calls[0] += 1
        if calls[0] < n:
            return logits
        return mx.where(mx.arange(logits.shape[-1]) == eos, 0.0, -1e9).astype(logits.dtype) + 0 * logits

    return processor


def test_peak_memory_does_not_follow_max_tokens(float_models):
    model, tokenizer = float_models["smollm2"]
    prompts = corpus_prompts(tokenizer, (5, 9, 12, 7, 16, 11))
    eos = tokenizer.eos_token_id
    peaks = {}
    for max_tokens in (8, 4096):
        mx.clear_cache()
        mx.reset_peak_memory()
        out = batch_generate(model, tokenizer, prompts, max_tokens=max_tokens,
                             logits_processors=[force_eos_after(4, eos)])
        assert out.finish_reasons == ["stop"] * len(prompts)
        peaks[max_tokens] = mx.get_peak_memory()
    # Reserving 4096 slots per row would add ~1.1 GB of float32 KV cache here; a
    # bounded step ahead (RESERVE_AHEAD slots per row) adds ~70 MB.
    assert peaks[4096] - peaks[8] < 0.15e9 and peaks[4096] < 1.3 * peaks[8], peaks


def test_huge_max_tokens_reserves_only_what_is_generated(float_models):
    model, tokenizer = float_models["smollm2"]
    mx.clear_cache()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    text = generate(model, tokenizer, corpus_prompts(tokenizer, (20,))[0], max_tokens=10**9,
                    logits_processors=[force_eos_after(6, tokenizer.eos_token_id)])
    assert text
    # Weights are resident already; the generation itself adds well under 100 MB.
    assert mx.get_peak_memory() - before < 100e6


def test_cache_that_cannot_fit_fails_before_it_starts():
    # No context length to cap max_tokens: 10**12 tokens of KV cache cannot fit.
    model = tiny_llama()
    with pytest.raises(ValueError, match="KV cache.*lower max_tokens or the batch size"):
        next(generate_step(mx.array([1, 2, 3]), model, max_tokens=10**12))
    # With a context length the reservation stops there, and grows as tokens come.
    model = tiny_llama(max_position_embeddings=64)
    cache = make_prompt_cache(model)
    steps = generate_step(mx.array([1, 2, 3]), model, max_tokens=10**12, prompt_cache=cache)
    for _ in range(5):
        next(steps)
    assert cache[0].keys.shape[2] <= 3 + 64
