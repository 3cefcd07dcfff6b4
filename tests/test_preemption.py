"""Rows taken out of a running batch and put back later (``BatchGenerator.suspend`` /
``resume``, what the server's preemption uses) give the tokens and log-probabilities they
give alone: greedy, seeded sampling and logits processors, resumed by recomputing every
token or from KV blocks stored when they were suspended (real SmolLM2 weights)."""

import numpy as np
import pytest

from conftest import CORPUS, model_dir
from mlx_lm_batched import load
from mlx_lm_batched.sampling.logits_processors import make_logits_processors
from mlx_lm_batched.sampling.samplers import make_sampler
from mlx_lm_batched.sched.block_prefix import make_prefix_cache
from mlx_lm_batched.sched.generator import BatchGenerator
from mlx_lm_batched.sched.request import Request

N = 14  # tokens each row generates
# docs/architecture.md "How batching stays exact": a row's log-probabilities against its
# prompt alone when the tokens it holds were computed in other chunks (a resumed row
# prefills the tokens it had decoded).
BOUND = 5.5e-5


@pytest.fixture(scope="module")
def smol():
    model, tokenizer = load(str(model_dir("smollm2", dtype="float32")))
    return model, tokenizer.encode(CORPUS, add_special_tokens=False)


def requests(ids):
    """Three rows of different lengths: greedy, seeded sampling, a repetition penalty."""
    return [
        lambda: Request.of(ids[:70], max_tokens=N),
        lambda: Request.of(ids[100:141], max_tokens=N, seed=7,
                           sampler=make_sampler(temp=0.9, top_p=0.95)),
        lambda: Request.of(ids[300:395], max_tokens=N, logits_processors=make_logits_processors(
            repetition_penalty=1.3)),
    ]


def run(gen, uids, on_step=None):
    """Step ``gen`` until rows ``uids`` (a list the steps may extend) finish: ``{uid: (tokens, logprobs)}``;
    ``on_step(step)`` may suspend and resume rows (returning the responses it got)."""
    out = {}
    finished = set()
    for step in range(500):
        responses = gen.next()[1]
        if on_step is not None:
            responses = responses + on_step(step)
        for r in responses:
            tokens, logprobs = out.setdefault(r.uid, ([], []))
            tokens.append(r.token)
            logprobs.append(np.array(r.logprobs))
            if r.finish_reason is not None:
                finished.add(r.uid)
        if finished >= set(uids):
            break
    gen.close()
    assert finished >= set(uids), "rows did not finish in 500 steps"
    return out


def alone(model, make):
    gen = BatchGenerator(model)
    (uid,) = gen.insert_requests([make()])
    return run(gen, [uid])[uid]


def test_suspended_rows_resume_with_the_tokens_they_give_alone(smol, row_invariant_matmuls):
    """Rows suspended mid-decode and mid-prefill and resumed later, recomputing what they
    held: each row's tokens and log-probabilities are those of its request alone."""
    model, ids = smol
    makes = requests(ids) + [
        lambda: Request.of(ids[500:700], max_tokens=N, seed=3, sampler=make_sampler(temp=1.0)),
        lambda: Request.of(ids[800:950], max_tokens=N)]
    expected = [alone(model, m) for m in makes]
    gen = BatchGenerator(model, prefill_tokens_per_step=32)
    uids = gen.insert_requests([m() for m in makes[:3]])
    held = {}

    def preempt(step):
        responses = []
        if step == 2:  # two long prompts join, one prefill: 32 tokens a step
            uids.extend(gen.insert_requests([makes[3](), makes[4]()]))
        if step == 4:  # rows 0 and 2 decode, row 3 is mid-prefill beside row 4
            got, caches = gen.suspend([uids[0], uids[2], uids[3]])
            responses += got
            held.update(caches)
        if step == 9:
            for u in (uids[3], uids[0], uids[2]):
                gen.resume(u)
        return responses

    got = run(gen, uids, on_step=preempt)
    assert set(held) == {uids[0], uids[2]}  # only decoding rows had a cache to keep
    for u, (tokens, logprobs) in zip(uids, expected):
        assert got[u][0] == tokens
        np.testing.assert_allclose(np.stack(got[u][1]), np.stack(logprobs), rtol=0, atol=BOUND)


def test_rows_resume_from_their_parked_blocks_bit_for_bit(smol, row_invariant_matmuls):
    """Rows suspended and parked in the KV block store (full blocks stored, the slots past
    the last one kept beside them) resume recomputing nothing they held: their tokens and
    log-probabilities are those of the same batch never paused, bit for bit."""
    model, ids = smol
    makes = requests(ids)
    never_paused = BatchGenerator(model)
    uids = never_paused.insert_requests([m() for m in makes])
    out = run(never_paused, uids)
    expected = [out[u] for u in uids]
    prefix = make_prefix_cache(model, block_size=16)
    gen = BatchGenerator(model)
    uids = gen.insert_requests([m() for m in makes])
    parked, held = {}, {}

    def preempt(step):
        if step == 5:
            got, caches = gen.suspend(uids)
            for u, (cache, tokens) in caches.items():
                parked[u] = prefix.park(model, tokens, cache)
            return got
        if step == 7:
            for u in uids:
                tokens = gen.suspended_tokens(u)
                cache, held[u] = prefix.unpark(model, parked[u], tokens)
                assert held[u] == len(tokens) - 1  # only the sampled token is left to feed
                gen.resume(u, cache, held[u])
        return []

    got = run(gen, uids, on_step=preempt)
    assert all(parked[u].full >= 32 for u in uids)  # every row read stored blocks
    for u, (tokens, logprobs) in zip(uids, expected):
        assert got[u][0] == tokens
        np.testing.assert_array_equal(np.stack(got[u][1]), np.stack(logprobs))


def test_a_row_whose_blocks_were_evicted_recomputes_them(smol, row_invariant_matmuls):
    """Parked blocks evicted before the resume (a store of one block's bytes): the row
    recomputes what is missing and still gives its tokens alone."""
    model, ids = smol
    make = requests(ids)[0]
    tokens_alone, logprobs_alone = alone(model, make)
    prefix = make_prefix_cache(model, block_size=16, max_bytes=1)
    gen = BatchGenerator(model)
    (uid,) = gen.insert_requests([make()])
    out = {}

    def preempt(step):
        if step == 4:
            got, caches = gen.suspend([uid])
            cache, tokens = caches[uid]
            out["parked"] = prefix.park(model, tokens, cache)
            return got
        if step == 5:
            tokens = gen.suspended_tokens(uid)
            cache, out["held"] = prefix.unpark(model, out["parked"], tokens)
            gen.resume(uid, cache, out["held"])
        return []

    got = run(gen, [uid], on_step=preempt)
    assert out["held"] == 0  # nothing stayed in the store
    assert got[uid][0] == tokens_alone
    np.testing.assert_allclose(np.stack(got[uid][1]), np.stack(logprobs_alone), rtol=0, atol=BOUND)


def test_a_removed_suspended_row_is_gone(smol):
    model, ids = smol
    gen = BatchGenerator(model)
    uids = gen.insert_requests([Request.of(ids[:20], max_tokens=8)] * 2)
    gen.next()
    gen.next()
    gen.suspend([uids[0]])
    gen.remove([uids[0]])
    with pytest.raises(KeyError, match="not suspended"):
        gen.resume(uids[0])
    out = run(gen, [uids[1]])
    assert len(out[uids[1]][0]) == 8


def test_a_sampled_row_recomputed_beside_a_fresh_prompt_keeps_its_key_stream(smol):
    """A seeded sampling row suspended twice mid-decode and resumed by recomputing,
    in one prefill with a fresh prompt: its tokens are those it samples alone."""
    model, ids = smol
    make = lambda: Request.of(ids[100:141], max_tokens=24, seed=11,  # noqa: E731
                              sampler=make_sampler(temp=0.8))
    expected, _ = alone(model, make)
    gen = BatchGenerator(model)
    (uid,) = gen.insert_requests([make()])
    uids = [uid]

    def preempt(step):
        if step in (3, 9):
            return gen.suspend([uid])[0]
        if step in (4, 10):
            gen.resume(uid)
            uids.extend(gen.insert_requests([Request.of(ids[200 + step:260], max_tokens=4)]))
        return []

    got = run(gen, uids, on_step=preempt)
    assert got[uid][0] == expected
