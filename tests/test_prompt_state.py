"""Per-row state that lives with the caches: a padded batch continued by later calls
(second turns, after save/load, after trim) equals each conversation run alone;
prompt-cache files shared with mlx-lm both ways; memory that follows what is
generated."""

import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched import batch_generate, generate
from mlx_lm_batched.batching import BatchEngine, left_pad
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
    assert isinstance(cache, PromptCache) and cache.padding == [3, 0] and cache.lengths == [3, 6]
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
        # What turn 2 feeds before the user turn: turn 1's last token (never fed),
        # plus the two trimmed ones when trimming.
        return generated[-3:] if between == "trim" else generated[-1:]

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
