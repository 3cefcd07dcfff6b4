"""Speculative decoding inside the batch.

Greedy rows must produce exactly the tokens of plain decoding (real SmolLM2 with its
4-bit copy drafting, prompt lookup, Gemma 3 drafting for itself), rows accept different
numbers of drafts in one step (their caches rewind per row), and sampled rows follow the
target's distribution (rejection sampling, checked on fixed distributions).
"""

import concurrent.futures as futures
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import openai
import pytest

import test_cli as cli
from conftest import corpus_prompts
from mlx_lm_batched import batch_generate, generate, load, stream_generate
from mlx_lm_batched.cache.kv import KVCache
from mlx_lm_batched.cache.prompt_cache import PromptCache
from mlx_lm_batched.cache.state import StateCache
from mlx_lm_batched.generate import BatchGenerator, generate_step, speculative_generate_step
from mlx_lm_batched.sample_utils import make_sampler
from mlx_lm_batched.sampling.rejection import rejection_accept
from server_harness import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_speculative import truncated_copy  # noqa: E402


@pytest.fixture(scope="module")
def smol(float_models):
    return float_models["smollm2"]


@pytest.fixture(scope="module")
def draft_dir(float_dirs, tmp_path_factory):
    """SmolLM2 cut to its first 12 of 30 layers: a cheap draft with the same tokenizer
    that often disagrees with the full model (so rows keep different numbers of drafts)."""
    return truncated_copy(float_dirs["smollm2"], tmp_path_factory.mktemp("draft"), 12)


@pytest.fixture(scope="module")
def draft(draft_dir):
    return load(str(draft_dir))[0]


def _kv(batch, slots):
    c = KVCache()
    k = mx.broadcast_to(mx.arange(slots, dtype=mx.float32)[None, None, :, None], (batch, 1, slots, 2))
    k = k + 100 * mx.arange(batch, dtype=mx.float32)[:, None, None, None]
    c.update_and_fetch(k, -k)
    return c


def test_rewind_rows_moves_each_row_right():
    cache = PromptCache([_kv(3, 6), _kv(3, 6)], padding=[0, 1, 2])
    cache.rewind_rows([1, 3, 2])  # every row drops >= 1: one slot goes for all
    assert cache.slots == 5 and cache.padding == [0, 3, 3]
    assert cache.offsets(3).tolist() == [5, 2, 2]
    keys, values = cache[0].ordered()
    # Each row's kept tokens end at the last slot, in order (row b's slot s held 100 b + s).
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4]
    assert keys[1, 0, 3:, 0].tolist() == [101, 102]
    assert keys[2, 0, 3:, 0].tolist() == [202, 203]
    assert mx.array_equal(values, -keys).item()
    with pytest.raises(ValueError, match="cannot drop"):
        cache.rewind_rows([0, 3, 0])  # row 1 holds 2 tokens
    with pytest.raises(ValueError, match="StateCache"):
        PromptCache([StateCache(2)], padding=[0]).rewind_rows([1])


def _first_tokens(p, q, drafts, rows=40000):
    """Tokens 1 and 2 of ``rows`` rows (token 2 only where token 1 was a kept draft)."""
    P = mx.broadcast_to(p, (rows, *p.shape))
    Q = None if q is None else mx.broadcast_to(q, (rows, *q.shape))
    if q is not None:  # drafts drawn from q
        D = mx.stack([mx.random.categorical(mx.log(Q[:, i]), key=mx.random.key(10 + i))
                      for i in range(q.shape[0])], axis=1)
    else:
        D = mx.broadcast_to(drafts, (rows, drafts.shape[0]))
    kept, nxt = rejection_accept(P, Q, D.astype(mx.int32), key=mx.random.key(3))
    kept, nxt, D = np.array(kept), np.array(nxt), np.array(D)
    first = np.where(kept > 0, D[:, 0], nxt)
    second = np.where(kept > 1, D[:, 1], nxt)[kept > 0]
    return first, second


@pytest.mark.parametrize("deterministic", [False, True])
def test_rejection_sampling_follows_the_target(deterministic):
    p = mx.array([[0.5, 0.2, 0.2, 0.1, 0.0], [0.1, 0.1, 0.1, 0.3, 0.4], [0.2] * 5])
    q = mx.array([[0.1, 0.6, 0.1, 0.1, 0.1], [0.25, 0.25, 0.0, 0.25, 0.25]])
    drafts = mx.array([1, 4])
    first, second = _first_tokens(p, None if deterministic else q, drafts)
    for tokens, target in ((first, p[0]), (second, p[1])):
        freq = np.bincount(tokens, minlength=5) / len(tokens)
        # 4 standard errors of a frequency near 0.5 with >= 8000 draws is below 0.023.
        assert np.abs(freq - np.array(target)).max() < 0.023, (freq, target)
    assert (first == 4).sum() == 0  # p = 0: never emitted, even when drafted


def test_single_stream_greedy_equals_plain(smol, draft):
    model, tokenizer = smol
    prompt = mx.array(corpus_prompts(tokenizer, [30])[0])
    plain = list(generate_step(prompt, model, max_tokens=10))
    out = list(speculative_generate_step(prompt, model, draft, num_draft_tokens=3, max_tokens=10))
    assert [t for t, _, _ in out] == [t for t, _ in plain]
    assert any(f for _, _, f in out) and not all(f for _, _, f in out)
    for (_, lp, _), (_, want) in zip(out, plain):  # the model's log-probabilities per token
        assert mx.abs(lp - want).max().item() < 1e-3
    text = "".join(r.text for r in stream_generate(model, tokenizer, "Once upon a time",
                                                  max_tokens=8, prompt_lookup=True))
    assert text == generate(model, tokenizer, "Once upon a time", max_tokens=8)


def test_batch_rows_keep_different_drafts_and_equal_plain(smol, draft):
    model, tokenizer = smol
    prompts = corpus_prompts(tokenizer, [9, 26, 17, 5])
    plain = batch_generate(model, tokenizer, prompts, max_tokens=10, return_token_ids=True,
                           return_prompt_caches=True)
    for options in (dict(draft_model=draft, num_draft_tokens=3),
                    dict(prompt_lookup=True, num_draft_tokens=2)):
        out = batch_generate(model, tokenizer, prompts, max_tokens=10, return_token_ids=True,
                             return_prompt_caches=True, **options)
        assert out.token_ids == plain.token_ids, options
        assert [c[0].offset for c in out.caches] == [c[0].offset for c in plain.caches]
        assert out.stats.generation_tokens == plain.stats.generation_tokens
    # Rows join mid-decode: two decode at a time, the others prefilled as rows end; each
    # step reports a row's kept drafts and its next token.
    gen = BatchGenerator(model, max_tokens=10, completion_batch_size=2, prefill_batch_size=1,
                         draft_model=draft, num_draft_tokens=3)
    uids = gen.insert(prompts, max_tokens=[10, 4, 10, 4])
    per_step, tokens = [], {u: [] for u in uids}
    while responses := gen.next_generated():
        counts = {}
        for r in responses:
            tokens[r.uid].append(r.token)
            counts[r.uid] = counts.get(r.uid, 0) + 1
        per_step.append(counts)
    assert [tokens[u] for u in uids] == [t[:m] for t, m in zip(plain.token_ids, [10, 4, 10, 4])]
    assert any(len(set(c.values())) > 1 for c in per_step)  # rows kept different numbers
    # Under a prefill token budget the target's and the draft's prefill go in calls of at
    # most 4 tokens while rows decode, with the same tokens.
    gen = BatchGenerator(model, max_tokens=10, completion_batch_size=2, prefill_batch_size=1,
                         draft_model=draft, num_draft_tokens=3, prefill_tokens_per_step=4)
    uids = gen.insert(prompts)
    tokens, fed, budgeted = {u: [] for u in uids}, {}, 0
    while any(len(t) < 10 for t in tokens.values()):
        decoding = any(0 < len(t) < 10 for t in tokens.values())
        prompt_responses, responses = gen.next()
        for r in prompt_responses:
            if decoding:
                assert r.progress[0] - fed.get(r.uid, 0) <= 4
                budgeted += 1
            fed[r.uid] = r.progress[0]
        for r in responses:
            tokens[r.uid].append(r.token)
    assert [tokens[u] for u in uids] == plain.token_ids
    assert budgeted >= (26 + 17 + 5) // 4  # the rows that joined later went 4 tokens a call


def test_gemma3_drafts_for_itself(float_models):
    model, tokenizer = float_models["gemma3"]
    prompts = corpus_prompts(tokenizer, [11, 4])
    plain = batch_generate(model, tokenizer, prompts, max_tokens=7, return_token_ids=True)
    out = batch_generate(model, tokenizer, prompts, max_tokens=7, return_token_ids=True,
                         draft_model=model, num_draft_tokens=2)
    assert out.token_ids == plain.token_ids


def test_sampled_self_draft_accepts_almost_every_draft(smol):
    model, tokenizer = smol
    prompt = mx.array(corpus_prompts(tokenizer, [20])[0])
    mx.random.seed(5)
    out = list(speculative_generate_step(prompt, model, model, num_draft_tokens=3, max_tokens=9,
                                         sampler=make_sampler(temp=1.0, top_k=40)))
    # t0 from the prefill, then rounds of 3 drafts + 1: p == q up to float rounding.
    assert sum(f for _, _, f in out) >= 5


def test_refusals(smol, draft):
    model, tokenizer = smol
    prompt = mx.array([1, 2, 3])
    run = lambda **kw: list(speculative_generate_step(prompt, model, **kw))  # noqa: E731
    with pytest.raises(ValueError, match="not both"):
        run(draft_model=draft, prompt_lookup=True)
    with pytest.raises(ValueError, match="num_draft_tokens must be >= 1"):
        run(draft_model=draft, num_draft_tokens=0)
    with pytest.raises(NotImplementedError, match="logits_processors"):
        run(draft_model=draft, logits_processors=[lambda h, l: l])
    with pytest.raises(ValueError, match="custom sampler"):
        run(prompt_lookup=True, sampler=lambda lp: mx.argmax(lp, axis=-1), max_tokens=3)
    with pytest.raises(ValueError, match="XTC"):
        run(prompt_lookup=True, sampler=make_sampler(temp=1.0, xtc_probability=0.5), max_tokens=3)


def test_cli_draft_model_equals_plain(float_dirs, draft_dir):
    base = ["--model", float_dirs["smollm2"], "--prompt", "Name three colours.", "--prompt",
            "Count to five.", "--max-tokens", 8, "--no-progress", "--verbose", "False"]
    plain = cli.run_cli(*base)
    drafted = cli.run_cli(*base, "--draft-model", draft_dir, "--num-draft-tokens", 2)
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout and plain.stdout.strip()
    both = cli.run_cli(*base, "--draft-model", "x", "--prompt-lookup")
    cli.assert_one_line_error(both, "--draft-model and --prompt-lookup", code=2)


def test_server_prompt_lookup_batches_exactly(float_dirs, smol):
    model, tokenizer = smol
    server = ServerProcess(float_dirs["smollm2"], "--prompt-lookup", "--num-draft-tokens", 3)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120,
                               max_retries=0)
        name = client.models.list().data[0].id
        stories = ["Once upon a time, in a small village by the sea,", "The recipe for bread is"]

        def ask(prompt):
            return client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                             temperature=0).choices[0].text

        with futures.ThreadPoolExecutor(2) as pool:
            texts = list(pool.map(ask, stories))
        assert texts == [generate(model, tokenizer, s, max_tokens=12) for s in stories]
        with pytest.raises(openai.BadRequestError, match="speculative"):
            client.completions.create(model=name, prompt=stories[0], max_tokens=4,
                                      logit_bias={"42": 5})
    finally:
        assert server.stop() == 0, server.output()
