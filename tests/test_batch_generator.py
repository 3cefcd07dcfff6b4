"""BatchGenerator (continuous batching) on real models: every row, whenever it joins,
generates what its prompt generates alone (``generate_step`` on the 1-D prompt)."""

import gc

import mlx.core as mx
import pytest

from conftest import corpus_prompts
from mlx_lm_batched.generate import BatchGenerator, StopSequences, generate_step
from mlx_lm_batched.cache.row_caches import cache_length
from mlx_lm_batched.sample_utils import make_logits_processors

TOL = 1e-4
_SOLO = {}


def solo(model, prompt, n, processors=None, key=None):
    """Tokens and first-step logprobs of ``prompt`` generated alone (cached per test run)."""
    k = (id(model), tuple(prompt), n, key)
    if k not in _SOLO:
        steps = generate_step(mx.array(prompt), model, max_tokens=n, logits_processors=processors)
        out = [(t, lp) for t, lp in steps]
        _SOLO[k] = ([t for t, _ in out], out[0][1])
    return _SOLO[k]


def run(gen, schedule, limit=2000):
    """Drive ``gen``: ``schedule`` maps a next()-call index to a list of inserts
    (``(prompt, kwargs)``). Returns per-uid results and the per-call log."""
    rows, log, calls = {}, [], 0
    uid_of = []
    while calls < limit:
        for prompt, kwargs in schedule.pop(calls, []):
            (uid,) = gen.insert([prompt], **kwargs)
            uid_of.append(uid)
            rows[uid] = {"tokens": [], "first": None, "finish": None, "prompt": list(prompt)}
        decoding = [u for u, r in rows.items() if r["tokens"] and r["finish"] is None]
        prompt_responses, responses = gen.next()
        calls += 1
        log.append((decoding, prompt_responses, responses))
        for r in responses:
            row = rows[r.uid]
            assert row["finish"] is None, "a finished row generated again"
            if row["first"] is None:
                row["first"] = r.logprobs
            row["tokens"].append(r.token)
            if r.finish_reason is not None:
                row.update(finish=r.finish_reason, cache=r.prompt_cache, all_tokens=r.all_tokens)
        if not schedule and all(r["finish"] for r in rows.values()):
            break
    return [rows[u] for u in uid_of], log


def assert_matches_solo(model, row, n):
    tokens, first = solo(model, row["prompt"], n)
    assert row["tokens"] == tokens[: len(row["tokens"])]
    assert mx.abs(row["first"] - first).max().item() < TOL


@pytest.mark.parametrize("name, lengths, joins", [
    ("smollm2", [300, 1, 37, 600], [0, 2, 5, 9]),
    ("gemma3", [600, 3, 530, 20], [0, 1, 4, 8]),  # crosses Gemma's 512-token window
])
def test_rows_joining_mid_decode_match_solo(float_models, name, lengths, joins):
    model, tok = float_models[name]
    n, step = 16, 128
    prompts = corpus_prompts(tok, lengths)
    gen = BatchGenerator(model, max_tokens=n, prefill_step_size=step)
    schedule = {}
    for at, p in zip(joins, prompts):
        schedule.setdefault(at, []).append((p, {}))
    rows, log = run(gen, schedule)
    for row in rows:
        assert_matches_solo(model, row, n)
        assert len(row["tokens"]) == n and row["finish"] == "length"
        assert row["all_tokens"] == row["prompt"] + row["tokens"]
        assert cache_length(row["cache"]) == len(row["all_tokens"])
    # Decoding rows step at every call, and a call prefills at most one chunk, so a
    # long prompt never stalls them for more than one chunk.
    seen = {}
    for decoding, prompt_responses, responses in log:
        assert set(decoding) <= {r.uid for r in responses}
        for r in prompt_responses:
            assert r.progress[0] - seen.get(r.uid, 0) <= step
            seen[r.uid] = r.progress[0]
    chunked = [i for i, (d, p, _) in enumerate(log) if d and any(not r.end_of_prompt for r in p)]
    assert len(chunked) >= 4  # the 530/600-token prompts were prefilled between decode steps


def test_prefill_tokens_per_step_bounds_calls_while_rows_decode(float_models):
    """``prefill_tokens_per_step``: while rows decode, a step's prefill calls feed at most
    that many prompt tokens over all their rows (whole chunks when nothing decodes), and
    every row still generates what its prompt generates alone."""
    model, tok = float_models["smollm2"]
    n, budget = 12, 96
    first, *group = corpus_prompts(tok, [300, 90, 150, 200])
    gen = BatchGenerator(model, max_tokens=n, prefill_step_size=2048,
                         prefill_tokens_per_step=budget)
    rows, log = run(gen, {0: [(first, {})], 2: [(p, {}) for p in group]})
    for row in rows:
        assert_matches_solo(model, row, n)
        assert len(row["tokens"]) == n and row["finish"] == "length"
    seen, bounded_calls = {}, 0
    for call, (decoding, prompt_responses, _) in enumerate(log):
        fed = 0
        for r in prompt_responses:
            fed += r.progress[0] - seen.get(r.uid, 0)
            seen[r.uid] = r.progress[0]
        if call == 0:  # nothing decodes yet: all but the last token in one chunk
            assert fed >= len(first) - 1 and not decoding
        elif decoding and prompt_responses:
            assert fed <= budget
            bounded_calls += 1
    # The group's 440 prompt tokens, at most ``budget`` per step (a step may run several
    # calls, of this prefill or the next, while its budget lasts): at least 5 steps.
    assert bounded_calls >= -(-440 // budget)


def test_max_tokens_stop_sequences_remove_and_stats(float_models):
    model, tok = float_models["smollm2"]
    n = 16
    prompts = corpus_prompts(tok, [20, 45, 8, 12])
    ref = [solo(model, p, n)[0] for p in prompts]
    # A two-token stop sequence from row 1's own output, and one that only half matches.
    stop = tuple(ref[1][6:8])
    expected_stop = next(j for j in range(1, n) if tuple(ref[1][j - 1 : j + 1]) == stop)
    stops = StopSequences([stop, (ref[1][2], -1)])
    gen = BatchGenerator(model, max_tokens=n, prefill_step_size=16)
    with gen.stats() as stats:
        uids = gen.insert(prompts[:3], max_tokens=[5, n, n],
                          stop_sequences=[StopSequences(), stops, StopSequences()])
        (late,) = gen.insert([prompts[3]], max_tokens=[7])
        tokens = {u: [] for u in uids + [late]}
        finish, removed, steps = {}, None, 0
        while len(finish) + (removed is not None) < 4:
            _, responses = gen.next()
            steps += bool(responses)
            for r in responses:
                tokens[r.uid].append(r.token)
                if r.finish_reason:
                    finish[r.uid] = r.finish_reason
            if removed is None and len(tokens[uids[2]]) == 3:
                removed = gen.remove([uids[2]], return_prompt_caches=True)
    assert finish[uids[0]] == "length" and tokens[uids[0]] == ref[0][:5]
    assert finish[uids[1]] == "stop" and tokens[uids[1]] == ref[1][: expected_stop + 1]
    assert finish[late] == "length" and tokens[late] == ref[3][:7]
    assert uids[2] not in finish and tokens[uids[2]] == ref[2][:3]
    cache, held = removed[uids[2]]
    assert held == prompts[2] + ref[2][:3] and cache_length(cache) == len(held)
    assert stats.prompt_tokens == sum(len(p) for p in prompts)
    assert stats.generation_tokens == sum(len(t) for t in tokens.values())
    assert stats.generation_steps == steps  # a decode step answers for every decoding row
    assert stats.prompt_time > 0 and stats.decode_time > 0
    assert stats.wall_time >= stats.prompt_time + stats.decode_time
    assert gen.next() == ([], [])  # nothing left


def test_removing_rows_mid_prefill_frees_their_caches_at_once(float_models):
    """A prefill whose rows are all removed before it ends releases its caches when
    ``remove`` returns, without waiting for Python's cycle collector (a server reads MLX
    active memory between steps: held caches would read as leaked); the row left
    generates what it generates alone."""
    model, tok = float_models["smollm2"]
    long, short = corpus_prompts(tok, [300, 20])
    gen = BatchGenerator(model, prefill_step_size=64)
    tokens = []

    def step():
        prompt_responses, responses = gen.next()
        tokens.extend(r.token for r in responses)
        return prompt_responses, bool(responses)

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        gen.insert([short], max_tokens=[4])
        while not step()[1]:
            pass  # until the short row decodes
        held = mx.get_active_memory()
        (gone,) = gen.insert([long], max_tokens=[4])
        prompt_responses, _ = step()  # one chunk of the long prompt
        assert [p.progress[0] for p in prompt_responses if p.uid == gone] == [64]
        assert mx.get_active_memory() > held + (1 << 20)  # its chunk's keys and values
        gen.remove([gone])
        assert mx.get_active_memory() <= held
        while any(step()):
            pass  # until nothing is left
        gen.close()
    finally:
        if enabled:
            gc.enable()
    assert tokens == solo(model, short, 4)[0]


def test_caches_are_free_when_the_last_rows_finish(float_models):
    """When a step's tokens end every row, the step queued for their caches has run by
    the time ``next`` returns: MLX active memory is back to what it was before the rows
    (a server reads it once no row runs)."""
    model, tok = float_models["smollm2"]
    gen = BatchGenerator(model, prefill_step_size=64)
    gc.collect()
    base = mx.get_active_memory()
    gen.insert(corpus_prompts(tok, [40, 25, 60, 33]), max_tokens=[3, 5, 4, 5])
    finished = 0
    while finished < 4:
        finished += sum(r.finish_reason is not None for r in gen.next()[1])
    assert mx.get_active_memory() <= base + (64 << 10)


@pytest.mark.parametrize("name, first_lengths", [("smollm2", [60, 9]), ("gemma3", [530, 30])])
def test_second_turn_continues_returned_caches(float_models, name, first_lengths):
    """Turn 1 batches a long and a short (padded) row; their caches, from a finished
    Response and from remove(return_prompt_caches=True), continue as the whole
    conversation alone would (Gemma's ring of 512 slots has wrapped for the long one)."""
    model, tok = float_models[name]
    a, c, b1, b2, fresh = corpus_prompts(tok, first_lengths + [12, 7, 15], stride=101)
    gen = BatchGenerator(model, max_tokens=6, prefill_step_size=256)
    ua, uc = gen.insert([a, c])
    done, removed = {}, None
    while ua not in done:
        _, responses = gen.next()
        for r in responses:
            if r.finish_reason:
                done[r.uid] = r
        if removed is None and any(r.uid == uc for r in responses):
            removed = gen.remove([uc], return_prompt_caches=True)  # after its first token
    cache_a, all_a = done[ua].prompt_cache, done[ua].all_tokens
    cache_c, all_c = removed[uc]
    assert all_a[: len(a)] == a and len(all_a) == len(a) + 6
    assert all_c[: len(c)] == c and len(all_c) == len(c) + 1 == cache_length(cache_c)
    n = 8
    u1, u2, u3 = gen.insert([b1, b2, fresh], max_tokens=[n] * 3, caches=[cache_a, cache_c, None],
                            all_tokens=[all_a, all_c, []])
    rows = {u1: all_a + b1, u2: all_c + b2, u3: fresh}
    out, first = {u: [] for u in rows}, {}
    while any(len(t) < n for t in out.values()):
        for r in gen.next()[1]:
            first.setdefault(r.uid, r.logprobs)
            out[r.uid].append(r.token)
    for u, conversation in rows.items():
        tokens, logprobs = solo(model, conversation, n)
        assert out[u] == tokens
        assert mx.abs(first[u] - logprobs).max().item() < TOL
    assert cache_length(cache_a) == len(all_a)  # the caller's cache is left as it was


def test_segments_report_ends_and_extract_cache(float_models):
    model, tok = float_models["smollm2"]
    s1, s2 = corpus_prompts(tok, [40, 25])
    gen = BatchGenerator(model, max_tokens=5, prefill_step_size=16)
    (uid,) = gen.insert_segments([[s1, s2]])
    extracted, progress, tokens = [], [], []
    while len(tokens) < 5:
        prompt_responses, responses = gen.next()
        for r in prompt_responses:
            progress.append(r.progress)
            if r.end_of_segment and not r.end_of_prompt:
                extracted.append(gen.extract_cache([uid])[uid])
        tokens += [r.token for r in responses]
    assert progress[-1] == (65, 65) and all(a <= 16 + b for (a, _), (b, _) in zip(progress[1:], progress))
    assert [len(t) for _, t in extracted] == [40, 64]  # segment ends; the last token starts generating
    assert extracted[0][1] == s1 and cache_length(extracted[0][0]) == 40
    assert tokens == solo(model, s1 + s2, 5)[0]


def test_per_row_samplers_and_logits_processors(float_models):
    model, tok = float_models["smollm2"]
    n = 10
    prompts = corpus_prompts(tok, [14, 30, 22, 9])
    calls = {"shared": [], "own": []}

    def counting(name):
        def sampler(logprobs):
            calls[name].append(logprobs.shape[0])
            return mx.argmax(logprobs, axis=-1)
        return sampler

    shared, own = counting("shared"), counting("own")
    penalty = make_logits_processors(repetition_penalty=1.5)
    gen = BatchGenerator(model, max_tokens=n)
    uids = gen.insert(prompts, samplers=[shared, None, shared, own],
                      logits_processors=[None, penalty, None, None])
    out = {u: [] for u in uids}
    while any(len(t) < n for t in out.values()):
        for r in gen.next()[1]:
            out[r.uid].append(r.token)
    for u, p in zip(uids, prompts):
        if u == uids[1]:
            expected = solo(model, p, n, processors=penalty, key="penalty")[0]
            assert expected != solo(model, p, n)[0]  # the penalty changes this row's text
        else:
            expected = solo(model, p, n)[0]
        assert out[u] == expected
    assert 2 in calls["shared"] and max(calls["shared"]) == 2  # rows of one sampler: one call
    assert set(calls["own"]) == {1}


def test_mlx_lm_style_server_loop_same_text_as_mlx_lm(float_dirs):
    """User code written for mlx-lm's BatchGenerator (a server-like loop: insert,
    next() until every uid finished, read Response fields) runs unchanged with our
    import and gives mlx-lm's greedy text on the same converted model."""
    import mlx_lm
    from mlx_lm.generate import BatchGenerator as MlxLmBatchGenerator

    def serve(batch_generator_cls, model, tokenizer, waves):
        gen = batch_generator_cls(model, max_tokens=18, prefill_step_size=32,
                                  stop_tokens=[[t] for t in tokenizer.eos_token_ids])
        texts, finish, uids, step = {}, {}, [], 0
        while waves or len(finish) < len(uids):
            if waves and waves[0][0] == step:
                uids += gen.insert(waves.pop(0)[1])
            prompt_responses, gen_responses = gen.next()
            step += 1
            for r in prompt_responses:
                assert r.progress[0] <= r.progress[1]
            for r in gen_responses:
                texts.setdefault(r.uid, [])
                if r.finish_reason != "stop":
                    texts[r.uid].append(r.token)
                assert float(r.logprobs[r.token].item()) <= 0
                if r.finish_reason is not None:
                    finish[r.uid] = r.finish_reason
                    assert r.all_tokens[-1] == r.token and r.prompt_cache is not None
        gen.close()
        return [(tokenizer.decode(texts[u]), finish[u]) for u in uids]

    path = str(float_dirs["smollm2"])
    from mlx_lm_batched import load
    model, tokenizer = load(path)
    prompts = corpus_prompts(tokenizer, [7, 90, 30, 50], stride=53)
    waves = lambda: [(0, prompts[:2]), (3, prompts[2:])]
    ours = serve(BatchGenerator, model, tokenizer, waves())
    ref_model, ref_tokenizer = mlx_lm.load(path)
    theirs = serve(MlxLmBatchGenerator, ref_model, ref_tokenizer, waves())
    assert ours == theirs
    assert all(text for text, _ in ours)


def test_stop_sequences_and_argument_errors(float_models):
    stops = StopSequences([(5, 6, 7), (6, 8), 9, ()])
    m = stops.matcher()
    assert [m.advance(t) for t in (5, 6, 8)] == [False, False, True]  # via the failure link
    m = stops.matcher()
    assert [m.advance(t) for t in (5, 5, 6, 7)] == [False, False, False, True]
    assert stops.matcher().advance(9) and not StopSequences().matcher().advance(9)
    model, _ = float_models["smollm2"]
    gen = BatchGenerator(model)
    with pytest.raises(ValueError, match="empty"):
        gen.insert([[]])
    with pytest.raises(ValueError, match="max_tokens"):
        gen.insert([[1, 2]], max_tokens=[0])
    with pytest.raises(ValueError, match="max_tokens must be a list with one entry per prompt, "
                                         "got int 4"):
        gen.insert([[1, 2]], max_tokens=4)
    with pytest.raises(ValueError, match="samplers must have one entry per prompt"):
        gen.insert([[1, 2], [3]], samplers=[None])
    with pytest.raises(TypeError, match=r"caches\[0\] must be a prompt cache"):
        gen.insert([[1, 2]], caches=[["not a cache"]])
    with pytest.raises(ValueError, match="prefill_step_size"):
        BatchGenerator(model, prefill_step_size=0)
    with pytest.raises(ValueError, match="prefill_tokens_per_step must be an integer >= 1"):
        BatchGenerator(model, prefill_tokens_per_step=0)


def test_max_kv_size_rotating_caches_match_solo(float_models):
    """With ``max_kv_size`` every layer keeps a 64-slot ring: rows joining later and a
    second turn from a wrapped, padded ring match ``generate_step(max_kv_size=64)``."""
    model, tok = float_models["smollm2"]
    n, m = 10, 64
    prompts = corpus_prompts(tok, [100, 20, 70, 9], stride=29)
    # The same prefill chunks alone: mlx-lm's max_kv_size rings (4 sink tokens) see keys
    # by a rule that depends on the chunking.
    alone = lambda p: [t for t, _ in generate_step(mx.array(p), model, max_tokens=n, max_kv_size=m,
                                                   prefill_step_size=32)]
    gen = BatchGenerator(model, max_tokens=n, max_kv_size=m, prefill_step_size=32)
    uids, out, finished, calls = gen.insert(prompts[:2]), {}, {}, 0
    while len(finished) < 3:
        if calls == 3:
            uids += gen.insert([prompts[2]])
        for r in gen.next()[1]:
            out.setdefault(r.uid, []).append(r.token)
            if r.finish_reason:
                finished[r.uid] = (r.prompt_cache, r.all_tokens)
        calls += 1
    assert [out[u] for u in uids] == [alone(p) for p in prompts[:3]]
    cache, held = finished[uids[1]]  # 30 tokens, left-padded (joined the 100-token row) in a wrapped ring
    gen.insert([prompts[3]], caches=[cache], all_tokens=[held])
    second = []
    while len(second) < n:
        second += [r.token for r in gen.next_generated()]
    assert second == alone(held + prompts[3])


def test_prefill_chunks_shorter_than_a_rows_padding():
    """A group whose padding is longer than one prefill chunk (a 7-token and a 1-token
    prompt, chunks of 5) still prefills exactly: every row equals its prompt alone."""
    from mlx_lm_batched.models import llama

    args = llama.ModelArgs.from_dict(dict(model_type="llama", hidden_size=64, num_hidden_layers=2,
                                          intermediate_size=96, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=100))
    model = llama.Model(args)
    mx.eval(model.parameters())
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14]]
    gen = BatchGenerator(model, max_tokens=6, prefill_step_size=5)
    uids = gen.insert(prompts)
    out = {u: [] for u in uids}
    while any(len(v) < 6 for v in out.values()):
        for r in gen.next_generated():
            out[r.uid].append(r.token)
    for uid, prompt in zip(uids, prompts):
        solo = [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=6)]
        assert out[uid] == solo
