"""batch_generate with per-row state on the real SmolLM2: prompt caches in and out
(a second turn equals the conversation alone, also after save/load), seeded sampled
rows independent of their batch mates, per-row stop strings, mlx-lm's example."""

import mlx.core as mx
import pytest

from conftest import corpus_prompts
from mlx_lm_batched import load
from mlx_lm_batched.generate import batch_generate, generate_step, stream_batch_generate
from mlx_lm_batched.models.cache import load_prompt_cache, save_prompt_cache
from mlx_lm_batched.sample_utils import make_sampler

QUESTIONS = ["What is the capital of France?", "Name three colors and describe each of them.",
             "2+2="]
FOLLOW_UPS = ["Why is that?", "Shorter please.", "And 3+3?"]


@pytest.fixture(scope="module")
def smollm2(float_dirs):
    return load(str(float_dirs["smollm2"]))


def chat(tokenizer, messages):
    return [tokenizer.apply_chat_template([{"role": "user", "content": m}],
                                          add_generation_prompt=True) for m in messages]


def greedy_alone(model, tokens, n):
    """The first ``n`` greedy tokens of ``tokens`` run alone from an empty cache."""
    out = []
    for (t, _), _ in zip(generate_step(mx.array(tokens), model, max_tokens=n), range(n)):
        out.append(int(t))
    return out


def in_cache(first_prompt, result, i, eos):
    """Tokens row ``i``'s returned cache holds: prompt, output and a final EOS."""
    extra = [eos] if result.finish_reasons[i] == "stop" else []
    return first_prompt + result.token_ids[i] + extra


def test_second_turn_equals_conversation_alone(smollm2, tmp_path):
    model, tok = smollm2
    first = chat(tok, QUESTIONS)  # different lengths: the batch is padded
    r1 = batch_generate(model, tok, first, max_tokens=[12, 20, 6], return_prompt_caches=True,
                        return_token_ids=True)
    assert len(r1.caches) == 3
    held = [in_cache(first[i], r1, i, tok.eos_token_id) for i in range(3)]
    # Each cache is unpadded and holds exactly its conversation so far.
    assert [c[0].offset for c in r1.caches] == [len(h) for h in held]
    second = [tok.encode(f"<|im_start|>user\n{m}<|im_end|>\n<|im_start|>assistant\n",
                         add_special_tokens=False) for m in FOLLOW_UPS]
    r2 = batch_generate(model, tok, second, max_tokens=8, prompt_caches=r1.caches,
                        return_token_ids=True)
    for i in range(3):
        alone = greedy_alone(model, held[i] + second[i], len(r2.token_ids[i]))
        assert r2.token_ids[i] == alone, i
        assert r2.texts[i] == tok.decode(alone)
    # The caches passed in are not modified: the same call again gives the same tokens.
    again = batch_generate(model, tok, second, max_tokens=8, prompt_caches=r1.caches,
                           return_token_ids=True)
    assert again.token_ids == r2.token_ids
    # After save/load, the caches continue the same way.
    loaded = []
    for i, cache in enumerate(r1.caches):
        path = str(tmp_path / f"row{i}.safetensors")
        save_prompt_cache(path, cache)
        loaded.append(load_prompt_cache(path))
    r3 = batch_generate(model, tok, second, max_tokens=8, prompt_caches=loaded,
                        return_token_ids=True)
    assert r3.token_ids == r2.token_ids


def test_mlx_lm_example_pattern(smollm2):
    """mlx-lm's examples/batch_generate_response.py with the import swapped."""
    model, tokenizer = smollm2
    prompts = chat(tokenizer, ["Write a story about Einstein.", "Why is the sky blue?",
                               "What time is it?", "How tall is Mt Everest?"])
    result = batch_generate(model, tokenizer, prompts, verbose=False, return_prompt_caches=True,
                            max_tokens=6)
    assert len(result.caches) == 4 and all(result.texts)
    prompts = chat(tokenizer, ["Could you summarize that?", "And what about the sea?",
                               "Try again?", "And Mt Olympus?"])
    second = batch_generate(model, tokenizer, prompts, verbose=False,
                            prompt_caches=result.caches, max_tokens=6)
    assert len(second.texts) == 4 and all(second.texts)
    assert second.caches is None


def test_seeded_rows_do_not_depend_on_batch_mates(smollm2):
    model, tok = smollm2
    a, b, c, d = corpus_prompts(tok, [9, 30, 17, 5])
    sampler = make_sampler(temp=1.0, top_p=0.95)

    def tokens(prompts, seeds):
        r = batch_generate(model, tok, prompts, max_tokens=10, sampler=sampler, seeds=seeds,
                           return_token_ids=True)
        return r.token_ids

    alone = tokens([a], [7])[0]
    assert tokens([b, a, c], [1, 7, 2])[1] == alone  # other mates, other position
    assert tokens([a, d], [7, 3])[0] == alone
    mates = tokens([c, a, b, d], [5, 7, None, 4])
    assert mates[1] == alone
    # The seed matters: another seed gives other tokens (10 draws at temperature 1).
    assert tokens([a], [8])[0] != alone


def test_per_row_sampler_settings(smollm2):
    """make_sampler(temp=[...]) with one value per prompt: the greedy rows equal greedy
    alone although rows are reordered by length inside the call."""
    model, tok = smollm2
    prompts = corpus_prompts(tok, [20, 6, 13])
    sampler = make_sampler(temp=[0.0, 1.0, 0.0])
    r = batch_generate(model, tok, prompts, max_tokens=6, sampler=sampler, seeds=[0, 1, 2],
                       return_token_ids=True)
    for i in (0, 2):
        assert r.token_ids[i] == greedy_alone(model, prompts[i], 6)


def test_per_row_stop_strings(smollm2):
    model, tok = smollm2
    prompts = chat(tok, QUESTIONS)
    plain = batch_generate(model, tok, prompts, max_tokens=24)
    # A stop in the middle of row 0's and row 1's own text; row 2 has none.
    stops = [plain.texts[0][10:14], plain.texts[1][15:18], []]
    assert all(s.strip() for s in stops[:2])
    r = batch_generate(model, tok, prompts, max_tokens=24, stop=stops)
    for i in (0, 1):
        assert r.finish_reasons[i] == "stop"
        assert r.texts[i] == plain.texts[i][: plain.texts[i].index(stops[i])]
    assert r.texts[2] == plain.texts[2] and r.finish_reasons[2] == plain.finish_reasons[2]
    # Streaming: the pieces never show any part of the stop, and add up to the text.
    pieces = ["", "", ""]
    for s in stream_batch_generate(model, tok, prompts, max_tokens=24, stop=stops):
        pieces[s.index] += s.text
    assert pieces == r.texts
    # One stop string shared by every row.
    shared = batch_generate(model, tok, prompts, max_tokens=24, stop=stops[0])
    assert shared.texts[0] == r.texts[0]


def test_bad_per_row_arguments(smollm2):
    model, tok = smollm2
    prompts = corpus_prompts(tok, [5, 6])
    with pytest.raises(ValueError, match="prompt_caches"):
        batch_generate(model, tok, prompts, prompt_caches=[None])
    with pytest.raises(TypeError, match="prompt_caches\\[1\\]"):
        batch_generate(model, tok, prompts, prompt_caches=[None, "x"])
    with pytest.raises(ValueError, match="seeds"):
        batch_generate(model, tok, prompts, seeds=[1])
    with pytest.raises(ValueError, match="seeds\\[0\\]"):
        batch_generate(model, tok, prompts, seeds=[-1, 2])
    with pytest.raises(ValueError, match="stop must have one entry per prompt"):
        batch_generate(model, tok, prompts, stop=[["a"], ["b"], ["c"]])
    with pytest.raises(TypeError, match="stop"):
        batch_generate(model, tok, prompts, stop=5)
    with pytest.raises(ValueError, match="cannot be seeded"):
        batch_generate(model, tok, prompts, sampler=lambda lp: mx.argmax(lp, -1), seeds=[1, 2])
    with pytest.raises(TypeError, match="seed"):
        batch_generate(model, tok, prompts, seed=3)
