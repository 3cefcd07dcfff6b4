"""Row independence on the real models (SmolLM2-135M, Gemma-3-270M), float32.

Each row of a left-padded batch must give the same greedy tokens, and first-step
logits within 1e-4, as the same prompt generated alone. Gemma's sliding window is
512 tokens, so prompts of 513+ tokens and long generations cross it.
"""

import copy
import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched import batch_generate, stream_generate
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.models.cache import make_prompt_cache

LENGTHS = (1, 2, 9, 33, 120, 257, 509, 600)
# Enough decode steps for the 509-token row to cross Gemma's 512-token window while
# generating (at its 4th token) and go on past it, with every row still decoding beside
# rows padded to 600 columns; each solo generation costs about 40 ms a token on 2 cores.
NEW_TOKENS = 24
ATOL = 1e-4


def first_step_logits(model, prompts, max_kv_size=None):
    """Logits after each row's last prompt token, through the model API with offsets."""
    tokens, padding = left_pad(prompts)
    cache = make_prompt_cache(model, max_kv_size)
    offset = mx.array([-p for p in padding])
    L = tokens.shape[1]
    if L > 1:
        model(tokens[:, :-1], offset=offset, cache=cache)
        mx.eval([c.state for c in cache])
    return np.array(model(tokens[:, -1:], offset=offset + L - 1, cache=cache)[:, -1])


def solo_tokens(model, tokenizer, prompt, max_tokens, **kwargs):
    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, **kwargs)
            if r.finish_reason != "stop"]


def assert_rows_equal_solo(model, tokenizer, prompts, max_tokens, **kwargs):
    batch = batch_generate(model, tokenizer, prompts, max_tokens=max_tokens,
                           return_token_ids=True, **kwargs)
    for i, prompt in enumerate(prompts):
        solo = solo_tokens(model, tokenizer, prompt, max_tokens,
                           **{k: v for k, v in kwargs.items() if k == "max_kv_size"})
        assert batch.token_ids[i] == solo, f"row {i} (prompt of {len(prompt)} tokens) differs"
    return batch


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_padded_rows_equal_solo(name, float_models):
    model, tokenizer = float_models[name]
    prompts = corpus_prompts(tokenizer, LENGTHS)
    batch_logits = first_step_logits(model, prompts)
    for i, prompt in enumerate(prompts):
        solo = first_step_logits(model, [prompt])[0]
        np.testing.assert_allclose(batch_logits[i], solo, atol=ATOL, rtol=0,
                                   err_msg=f"{name}: first-step logits of row {i}")
    batch = assert_rows_equal_solo(model, tokenizer, prompts, NEW_TOKENS)
    # Real generations, not degenerate: most rows produce the full budget.
    assert sum(len(t) == NEW_TOKENS for t in batch.token_ids) >= len(prompts) // 2
    # The 509-token row decoded across Gemma's 512-token window.
    assert len(batch.token_ids[LENGTHS.index(509)]) > 512 - 509 + 1


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_chunked_prefill_rows_equal_solo(name, float_models):
    # A prefill step smaller than the prompts: chunks cross padding and the window.
    model, tokenizer = float_models[name]
    prompts = corpus_prompts(tokenizer, (1, 45, 150, 530))
    assert_rows_equal_solo(model, tokenizer, prompts, 16, prefill_step_size=64)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_max_kv_size_rows_equal_solo(name, float_models):
    # The cache keeps 100 slots; prompts are longer, so every layer rotates.
    model, tokenizer = float_models[name]
    prompts = corpus_prompts(tokenizer, (3, 60, 170, 290))
    logits = first_step_logits(model, prompts, max_kv_size=100)
    for i, prompt in enumerate(prompts):
        solo = first_step_logits(model, [prompt], max_kv_size=100)[0]
        # Rotating chunks attend over differently shaped key blocks in the batch and
        # alone; float32 summation order then moves logits of ~16 by up to ~1e-5 relative.
        np.testing.assert_allclose(logits[i], solo, atol=ATOL, rtol=1e-5)
    assert_rows_equal_solo(model, tokenizer, prompts, 16, max_kv_size=100)


def test_rows_finish_independently(float_models):
    # Per-row max_tokens: short rows stop early and leave the batch; the rest go on.
    model, tokenizer = float_models["smollm2"]
    prompts = corpus_prompts(tokenizer, (5, 40, 12, 80, 25))
    limits = [3, 20, 1, 20, 7]
    batch = batch_generate(model, tokenizer, prompts, max_tokens=limits, return_token_ids=True,
                           return_logprobs=True)
    for i, prompt in enumerate(prompts):
        solo = solo_tokens(model, tokenizer, prompt, limits[i])
        assert batch.token_ids[i] == solo
        assert len(batch.logprobs[i]) == len(solo)
        assert all(lp <= 0 for lp in batch.logprobs[i])
    assert batch.finish_reasons[0] == "length" and batch.finish_reasons[2] == "length"


def test_grouped_decode_attention_matches_one_call(float_models):
    # batch_generate's decode steps on the CPU split attention into row groups that
    # skip their shared padding slots: same logits as one call over every slot.
    from mlx_lm_batched.engine.batch_engine import BatchEngine

    model, tokenizer = float_models["smollm2"]
    prompts = sorted(corpus_prompts(tokenizer, [3, 9, 40, 60, 180, 200, 410, 430]), key=len)
    engine = BatchEngine(model)
    tokens, padding = left_pad(prompts)
    y, _ = engine.prefill(tokens, padding)
    # The prefill stored its groups' rows in buffers of their own (row blocks); the
    # first step reads them by group, later ones (after a step without groups turned
    # them into one rectangle) slice the rectangle.
    assert all(len(c.blocks) >= 2 and c.blocks[0].first > 0 for c in engine.cache)
    for _ in range(3):
        groups = engine._decode_groups
        assert groups is not None and len(groups) >= 2 and groups[0][2] > 0
        snapshot = [(c.keys, c.values, [copy.copy(b) for b in c.blocks or ()], c.size)
                    for c in engine.cache]
        grouped = engine.step(y)[1]
        mx.eval(grouped)
        for c, (k, v, blocks, size) in zip(engine.cache, snapshot):
            c.keys, c.values, c.blocks, c.size = k, v, blocks or None, size
        # Without groups every layer fetches all rows at once: one rectangle.
        engine._decode_groups = None
        single = engine.step(y)[1]
        engine._decode_groups = groups
        np.testing.assert_allclose(np.array(grouped), np.array(single), atol=1e-5, rtol=1e-5)
        y = mx.argmax(single, axis=-1)
