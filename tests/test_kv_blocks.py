"""The KV block store (``cache/kv_blocks.py``) on the real SmolLM2: chain keys, sharing,
eviction under a byte bound, adapters, and exactness of a prefix assembled from blocks
against the same prompt prefilled cold (``BatchGenerator`` direct)."""

import mlx.core as mx
import numpy as np
import pytest

from conftest import CORPUS, model_dir
from mlx_lm_batched import load
from mlx_lm_batched.cache.kv import KVCache
from mlx_lm_batched.cache.prompt_cache import trim_prompt_cache
from mlx_lm_batched.cache.row_caches import copy_cache
from mlx_lm_batched.cache.kv_blocks import BlockStore, block_cacheable, block_key
from mlx_lm_batched.cache.rotating import RotatingKVCache
from mlx_lm_batched.sched.block_prefix import (BlockPrefixCache, make_prefix_cache,
                                               model_fingerprint)
from mlx_lm_batched.sched.generator import BatchGenerator
from mlx_lm_batched.sched.prefix_cache import LRUPromptCache

B = 32
SYSTEM = 600  # not a whole number of blocks: one block straddles its end


@pytest.fixture(scope="module")
def smol():
    model, tokenizer = load(str(model_dir("smollm2", dtype="float32")))
    ids = tokenizer.encode(CORPUS, add_special_tokens=False)
    return model, ids


def text(ids, n, start=0):
    """``n`` token ids cut from the corpus (repeated) from ``start``."""
    reps = (start + n) // len(ids) + 1
    return (ids * reps)[start:start + n]


def generate(model, prompt, n=8, cache=None, prefix=None, **options):
    """``(greedy tokens, logprobs of every step, the finished row's cache and tokens)``
    of one row through ``BatchGenerator``; ``cache`` holds ``prefix``, ``prompt`` the rest."""
    gen = BatchGenerator(model, **options)
    gen.insert([prompt], max_tokens=[n], caches=None if cache is None else [cache],
               all_tokens=None if prefix is None else [prefix])
    tokens, logprobs = [], []
    while True:
        _, responses = gen.next()
        for r in responses:
            tokens.append(r.token)
            logprobs.append(np.array(r.logprobs))
            if r.finish_reason is not None:
                gen.close()
                return tokens, np.stack(logprobs), r.prompt_cache, r.all_tokens


def dense_copy(cache):
    """Layer caches holding ``cache``'s slots in dense arrays of their own."""
    out = []
    for layer in cache:
        k, v = layer.state
        own = KVCache()
        own.state = [mx.array(k), mx.array(v)]
        out.append(own)
    return out


def test_chain_keys_name_content_and_past():
    fp = b"model-a"
    store = BlockStore(fp, block_size=4)
    tokens = list(range(12))
    keys = store.chain(tokens)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert store.chain(tokens + [99, 98]) == keys  # a partial block has no key
    assert keys[0] == block_key(b"", tokens[:4], 0, fp)
    assert keys[1] == block_key(keys[0], tokens[4:8], 0, fp)
    other = store.chain([0, 1, 2, 3, 4, 5, 6, 77, 8, 9, 10, 11])
    assert other[0] == keys[0] and other[1] != keys[1] and other[2] != keys[2]  # the past counts
    assert store.chain([100] + tokens[1:])[1:] != keys[1:]  # an earlier change reaches later blocks
    assert BlockStore(b"model-b", block_size=4).chain(tokens)[0] != keys[0]
    assert store.chain(tokens, adapter=1)[0] != keys[0]


def test_only_plain_kv_caches_are_block_cacheable(smol):
    model, _ = smol
    assert isinstance(make_prefix_cache(model), BlockPrefixCache)
    assert isinstance(make_prefix_cache(model, kv_bits=8), LRUPromptCache)
    assert isinstance(make_prefix_cache(model, blocks=False), LRUPromptCache)
    assert not block_cacheable([KVCache(), RotatingKVCache(64)])
    assert not block_cacheable([])


def test_fingerprint_tells_models_apart(smol):
    model, _ = smol
    fp = model_fingerprint(model)
    assert fp == model_fingerprint(model) and len(fp) == 16
    layer = model.model.layers[-1].mlp.down_proj  # the last tensor is sampled
    saved = layer.weight
    try:
        layer.weight = saved * 1.001
        assert model_fingerprint(model) != fp
    finally:
        layer.weight = saved
    assert model_fingerprint(model) == fp


def test_conversations_share_the_system_prompt_blocks(smol):
    model, ids = smol
    fp = model_fingerprint(model)
    system = text(ids, SYSTEM)
    store = BlockStore(fp, block_size=B)
    own = []
    for start in (300, 500):  # two conversations: the same system prompt, their own turn
        prompt = system + text(ids, 70, start)
        _, _, cache, tokens = generate(model, prompt, n=4)
        store.insert(tokens, cache)
        own.append(len(tokens))
    per_block = store.nbytes // len(store)
    shared = SYSTEM // B  # 18 full blocks of the system prompt, held once
    # Each conversation's own full blocks: those past the shared ones (the block that
    # straddles the end of the system prompt already differs).
    expected = shared + sum(n // B - shared for n in own)
    assert len(store) == expected
    assert store.nbytes == expected * per_block
    # One layer of one block: (1, kv heads, B, head dim) keys and values, float32.
    args = model.args
    head_dim = args.hidden_size // args.num_attention_heads
    assert per_block == args.num_hidden_layers * 2 * args.num_key_value_heads * B * head_dim * 4
    # A third conversation reuses the whole shared run from memory.
    third = system + text(ids, 40, 900)
    hit = store.lookup(third)
    assert hit.memory_tokens == shared * B and hit.disk_tokens == 0
    assert hit.cache[0].size == shared * B
    assert store.stats()["blocks_in_use"] == shared
    store.release(hit.keys)
    assert store.stats()["blocks_in_use"] == 0


def test_eviction_keeps_the_byte_bound_and_spares_pinned_blocks(smol):
    model, ids = smol
    fp = model_fingerprint(model)
    a, b = text(ids, 20 * B + 5, 0), text(ids, 20 * B + 5, 333)
    _, _, cache_a, tokens_a = generate(model, a, n=1)
    _, _, cache_b, tokens_b = generate(model, b, n=1)
    probe = BlockStore(fp, block_size=B)
    probe.insert(tokens_a[:B], cache_a)
    per_block = probe.nbytes
    store = BlockStore(fp, block_size=B, max_bytes=10 * per_block)
    store.insert(tokens_a, cache_a)
    assert len(store) == 10 and store.nbytes <= store.max_bytes
    hit = store.lookup(a)
    assert hit.tokens == 10 * B  # the chain's first ten blocks: its head was kept
    # Pinned by a running row: another prompt cannot take its room.
    assert store.insert(tokens_b, cache_b) == 0
    store.release(hit.keys)
    store.insert(tokens_b, cache_b)
    assert len(store) == 10 and store.nbytes <= store.max_bytes
    assert store.lookup(a).cache is None  # least recently used: a's blocks went first
    assert store.lookup(b).tokens == 10 * B


def test_another_adapter_slot_never_shares(smol):
    model, ids = smol
    prompt = text(ids, 5 * B + 3, 50)
    _, _, cache, tokens = generate(model, prompt, n=1)
    store = BlockStore(model_fingerprint(model), block_size=B)
    store.insert(tokens, cache, adapter=0)
    n = len(store)
    assert store.lookup(prompt, adapter=1).cache is None
    store.insert(tokens, cache, adapter=1)
    assert len(store) == 2 * n
    hit = store.lookup(prompt, adapter=1)
    assert hit.tokens == 5 * B and set(hit.keys).isdisjoint(store.chain(prompt, 0))
    store.release(hit.keys)


def test_a_row_pins_its_prefix_blocks_while_it_runs(smol):
    model, ids = smol
    prompt = text(ids, 4 * B + 9, 77)
    _, _, cache, tokens = generate(model, prompt, n=1)
    prefix = BlockPrefixCache(model, BlockStore(model_fingerprint(model), block_size=B))
    prefix.insert_cache(model, tokens, cache)
    fetched, rest = prefix.fetch_nearest_cache(model, prompt)
    assert len(rest) == 9 and prefix.gauges()["blocks_in_use"] == 0  # not yet a row's
    prefix.hold(7, fetched)
    assert prefix.gauges()["blocks_in_use"] == 4 and prefix.gauges()["blocks_cached"] == 0
    prefix.release(7)
    prefix.release(7)  # a row leaves once; a second release is a no-op
    assert prefix.gauges()["blocks_in_use"] == 0 and prefix.gauges()["blocks_cached"] == 4
    assert prefix.gauges()["hit_tokens_memory"] == 4 * B


@pytest.mark.parametrize("step", [32, 48])
def test_prefix_from_blocks_gives_the_same_tokens_and_logprobs(smol, step):
    """Exactness (invariant 1): a row whose prefix comes from blocks gives the same bits
    as the same prefix from the row's own dense cache, and the same tokens as the prompt
    prefilled cold. Against cold, logprobs are the same bits when the prefill chunks
    end at block edges (32) and within the prefix cache's bound otherwise (48: the
    CPU BLAS sums a differently cut chunk in another order)."""
    model, ids = smol
    first = text(ids, 7 * B + 11, 120)
    _, _, cache, tokens = generate(model, first, n=6, prefill_step_size=step)
    dense = copy_cache(cache)
    prefix = make_prefix_cache(model, block_size=B)
    prefix.insert_cache(model, tokens, cache)
    follow = tokens + text(ids, 23, 700)
    got_cache, rest = prefix.fetch_nearest_cache(model, follow)
    reused = len(follow) - len(rest)
    assert reused == (len(tokens) // B) * B and reused > 0
    trim_prompt_cache(dense, len(tokens) - reused)
    own = generate(model, rest, n=10, cache=dense, prefix=follow[:reused], prefill_step_size=step)
    got = generate(model, rest, n=10, cache=got_cache, prefix=follow[:reused],
                   prefill_step_size=step)
    want = generate(model, follow, n=10, prefill_step_size=step)
    assert got[0] == own[0] == want[0]
    np.testing.assert_array_equal(got[1], own[1])
    if step % B == 0:
        np.testing.assert_array_equal(got[1], want[1])
    else:
        np.testing.assert_allclose(got[1], want[1], atol=1e-4, rtol=0)
    # The row's own dense cache is not needed by the store: its blocks are copies.
    del cache
    again, rest2 = prefix.fetch_nearest_cache(model, follow)
    assert rest2 == rest
    for c, d in zip(again, got_cache):
        assert mx.array_equal(c.state[0], d.state[0])


def test_a_finished_row_keeps_its_head_and_stores_only_its_own_blocks(smol):
    """A row continued from stored blocks ends with a cache that still reads the store's
    block arrays (the same objects) and holds only its own slots, and storing it slices
    its new blocks from its own buffer: the same bits as storing a dense copy of it."""
    model, ids = smol
    _, _, cache, tokens = generate(model, text(ids, 8 * B + 5, 300), n=1)
    prefix = make_prefix_cache(model, block_size=B)
    prefix.insert_cache(model, tokens, cache)
    follow = tokens[:8 * B] + text(ids, 2 * B + 9, 900)
    head, rest = prefix.fetch_nearest_cache(model, follow)
    _, _, done, held = generate(model, rest, n=B, cache=head, prefix=follow[:8 * B])
    store = prefix.store
    first_block = store._blocks[store.chain(follow, 0, 1)[0]]
    for layer, c in enumerate(done):
        (block,) = c.blocks
        assert block.head[0][0] is store._blocks[first_block.key].keys[layer]
        assert block.keys.shape[2] == c.size - 8 * B  # its own slots, no copy of the head
    dense = dense_copy(done)
    other = BlockStore(store.fingerprint, B)
    keys = store.chain(held)
    assert store.insert(held, done) == len(keys) - 8 and other.insert(held, dense) == len(keys)
    for key in keys[8:]:
        ours, ref = store._blocks[key], other._blocks[key]
        for a, b in zip(ours.keys + ours.values, ref.keys + ref.values):
            assert a.shape == b.shape and mx.array_equal(a, b).item()


def test_rows_on_a_cached_prefix_start_one_per_step_with_their_first_tokens(
        smol, row_invariant_matmuls):
    """While a row decodes, rows continued from stored blocks (each prefilled alone) start
    one per step, and each row's first token comes with the step right after its prefill
    (not after the prefills of the rows behind it); each gives the tokens and logprob bits
    it gives alone."""
    model, ids = smol
    _, _, cache, tokens = generate(model, text(ids, 8 * B + 5, 300), n=1)
    prefix = make_prefix_cache(model, block_size=B)
    prefix.insert_cache(model, tokens, cache)
    follows = [tokens[:8 * B] + text(ids, 20 + 3 * i, 1200 + 40 * i) for i in range(5)]
    gen = BatchGenerator(model)
    first = gen.insert([text(ids, 40, 2000)], max_tokens=[12])
    while not gen.next()[1]:
        pass  # until the first row decodes
    fetched = [prefix.fetch_nearest_cache(model, f) for f in follows]
    uids = gen.insert([rest for _, rest in fetched], max_tokens=[6] * 5,
                      caches=[c for c, _ in fetched], all_tokens=[f[:8 * B] for f in follows])
    out = {u: ([], []) for u in uids + first}
    started_at, first_token_at, step = {}, {}, 0
    while any(len(t) < 6 for u, (t, _) in out.items() if u in uids):
        prompt_responses, responses = gen.next()
        step += 1
        started_at.update((p.uid, step) for p in prompt_responses if p.end_of_prompt)
        for r in responses:
            first_token_at.setdefault(r.uid, step)
            out[r.uid][0].append(r.token)
            out[r.uid][1].append(np.array(r.logprobs))
    gen.close()
    assert sorted(started_at) == sorted(uids)
    assert len(set(started_at.values())) == len(uids), started_at  # one row per step
    assert all(first_token_at[u] == started_at[u] + 1 for u in uids), (started_at, first_token_at)
    for f, (c, rest), u in zip(follows, fetched, uids):
        alone, lp, _, _ = generate(model, rest, n=6, cache=prefix.fetch_nearest_cache(model, f)[0],
                                   prefix=f[:8 * B])
        assert out[u][0] == alone
        np.testing.assert_array_equal(np.stack(out[u][1]), lp)


def test_rows_on_one_prefix_read_its_blocks_in_place(smol):
    """Three conversations continued from one stored 8-block prefix decode together: each
    row's layer caches hold the store's own block arrays (the same objects, no copy) and
    only their own tokens in buffers of their own, and every row gives the same tokens
    and logprob bits as with the prefix in a dense cache of its own."""
    model, ids = smol
    first = text(ids, 8 * B + 5, 300)
    _, _, cache, tokens = generate(model, first, n=1)
    prefix = make_prefix_cache(model, block_size=B)
    prefix.insert_cache(model, tokens, cache)
    follows = [tokens[:8 * B] + text(ids, n, 900 + 50 * i) for i, n in enumerate((7, 19, 12))]
    fetched = [prefix.fetch_nearest_cache(model, f) for f in follows]
    assert all(len(f) - len(rest) == 8 * B for f, (_, rest) in zip(follows, fetched))

    def run(caches):
        gen = BatchGenerator(model)
        uids = gen.insert([rest for _, rest in fetched], max_tokens=[6] * 3, caches=caches,
                          all_tokens=[f[:8 * B] for f in follows])
        out = {u: ([], []) for u in uids}
        layer0 = None
        while any(len(t) < 6 for t, _ in out.values()):
            _, responses = gen.next()
            for r in responses:
                out[r.uid][0].append(r.token)
                out[r.uid][1].append(np.array(r.logprobs))
            if gen._decode is not None and gen._decode.engine.rows == 3 and layer0 is None:
                blocks = gen._decode.engine.cache[0].blocks or []  # while all three run
                layer0 = ([b.head for b in blocks], sum(b.keys.shape[2] for b in blocks))
        gen.close()
        return [out[u] for u in uids], layer0

    shared, layer0 = run([c for c, _ in fetched])
    first_block = prefix.store._blocks[prefix.store.chain(follows[0], 0, 1)[0]]
    heads, own_slots = layer0
    assert len(heads) == 3 and all(h is not None for h in heads)
    for head_keys, _ in heads:
        assert len(head_keys) == 8 and head_keys[0] is first_block.keys[0]
    assert own_slots < 3 * 8 * B  # the rows' own buffers hold no copy of the prefix
    alone, _ = run([dense_copy(c) for c, _ in fetched])  # each row a dense prefix of its own
    for (t1, lp1), (t2, lp2) in zip(shared, alone):
        assert t1 == t2
        np.testing.assert_array_equal(np.stack(lp1), np.stack(lp2))
