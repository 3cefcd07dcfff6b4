"""Full key/value caches stored by row blocks (``cache/row_blocks.py``): a batch of mixed
prompt lengths keeps about the ideal cache (each row's own tokens), and every path that
reads or reshapes a layer cache (decode, join, filter, extract, save) gives what
the rows give alone. Real SmolLM2 weights (float32)."""

import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched.cache.files import load_prompt_cache, save_prompt_cache
from mlx_lm_batched.cache.kv import KVCache
from mlx_lm_batched.cache.kv_blocks import BlockStore
from mlx_lm_batched.cache.views import RowsView
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.kv_budget import cache_bytes
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.models.cache import make_prompt_cache

LENGTHS = [5, 9, 30, 34, 120, 128, 300, 310]
STEPS = 6


def _alone(model, prompt, steps=STEPS + 2):
    """Tokens and per-step logits of ``prompt`` alone (one row, one rectangle)."""
    engine = BatchEngine(model)
    engine.reserve(steps)
    y, _ = engine.prefill(mx.array([prompt]))
    tokens, logits = [y.item()], []
    for _ in range(steps):
        y, lp = engine.step(y)
        tokens.append(y.item())
        logits.append(np.array(lp[0]))
    return tokens, logits


def _batch(model, prompts, steps=STEPS):
    engine = BatchEngine(model)
    engine.reserve(steps)
    tokens, padding = left_pad(prompts)
    y, _ = engine.prefill(tokens, padding)
    return engine, y


def _decode(engine, y, steps=STEPS):
    tokens, logits = [[t] for t in y.tolist()], [[] for _ in range(engine.rows)]
    for _ in range(steps):
        y, lp = engine.step(y)
        for row, t in enumerate(y.tolist()):
            tokens[row].append(t)
            logits[row].append(np.array(lp[row]))
    return tokens, logits, y


@pytest.fixture(scope="module")
def smol(float_models):
    model, tokenizer = float_models["smollm2"]
    prompts = sorted(corpus_prompts(tokenizer, LENGTHS), key=len)
    return model, prompts, [_alone(model, p) for p in prompts]


def test_batch_keeps_about_the_ideal_cache_and_each_rows_logits(smol):
    model, prompts, alone = smol
    engine, y = _batch(model, prompts)
    blocks = engine.cache[0].blocks
    assert blocks is not None and len(blocks) >= 2 and blocks[0].first > 0
    assert all(c.blocks is not None and len(c.blocks) == len(blocks) for c in engine.cache)
    tokens, logits, _ = _decode(engine, y)
    for row, (want_tokens, want_logits) in enumerate(alone):
        assert tokens[row] == want_tokens[:STEPS + 1]
        np.testing.assert_allclose(np.stack(logits[row]), np.stack(want_logits[:STEPS]),
                                   atol=1e-4)
    # The rectangle would hold every row at the longest row's slots; the blocks hold
    # each row from its block's first slot: within 1.2x the rows' own caches here.
    slots = engine.cache.slots
    ideal = sum(sum(cache_bytes(model, make_prompt_cache(model), 1, n + STEPS + 1))
                for n in map(len, prompts))
    rectangle = sum(cache_bytes(model, make_prompt_cache(model), len(prompts), slots))
    assert engine.nbytes <= 1.2 * ideal < 0.6 * rectangle


def test_rows_join_mid_decode_and_leave(smol):
    model, prompts, alone = smol
    first, y1 = _batch(model, prompts[:4])
    second, y2 = _batch(model, prompts[4:])
    t1, _, y1 = _decode(first, y1, 2)
    first.extend(second)  # rows join without copying: their blocks move after ours
    assert first.cache[0].blocks is not None and first.rows == len(prompts)
    y = mx.concatenate([y1, y2])
    tokens, logits, y = _decode(first, y, 3)
    for row in range(4):
        assert t1[row] + tokens[row][1:] == alone[row][0][:6]
    for row in range(4, 8):
        assert tokens[row] == alone[row][0][:4]
        np.testing.assert_allclose(np.stack(logits[row]), np.stack(alone[row][1][:3]), atol=1e-4)
    # Rows leave (kept in order: blocks filter in place) and the rest continue exactly.
    keep = [1, 4, 6]
    first.filter(keep)
    assert first.cache[0].blocks is not None
    more, _, _ = _decode(first, y[mx.array(keep)], 2)
    for row, orig in enumerate(keep):
        done = 6 if orig < 4 else 4
        assert more[row][1:] == alone[orig][0][done:done + 2]


def test_extract_save_and_reorder_see_the_rows_alone(smol, tmp_path):
    model, prompts, alone = smol
    engine, y = _batch(model, prompts)
    _decode(engine, y, 2)
    for row in (0, 3, 7):  # one row's cache: exactly its tokens, as a prompt cache alone
        cache = engine.extract_row(row)
        assert cache[0].size == len(prompts[row]) + 2
    # A saved batch cache is the rectangle (mlx-lm's layout) and continues every row.
    path = str(tmp_path / "batch.safetensors")
    save_prompt_cache(path, engine.cache)
    loaded = load_prompt_cache(path)
    assert loaded[0].blocks is None and loaded.padding == engine.cache.padding
    for c, d in zip(engine.cache, loaded):
        np.testing.assert_array_equal(np.array(c.state[0]), np.array(d.state[0]))
    # Rows in a new order: one rectangle (blocks hold contiguous rows), same rows.
    engine.filter([7, 0, 3])
    assert engine.cache[0].blocks is None
    y = mx.array([alone[7][0][2], alone[0][0][2], alone[3][0][2]])
    tokens, _, _ = _decode(engine, y, 2)
    assert [t[1:] for t in tokens] == [alone[r][0][3:5] for r in (7, 0, 3)]


def test_a_row_read_in_place_is_stored_without_a_copy_and_the_batch_goes_on(smol):
    # A leading row's blocks are stored from views of the batch's buffers
    # (``extract_row(..., views=True)``): nothing is allocated for the row itself, the
    # store's blocks are its own copies, and once the views are gone the batch writes
    # in place and every row continues as alone.
    model, prompts, alone = smol
    engine, y = _batch(model, prompts)
    _, _, y = _decode(engine, y, 2)
    blocks = engine.cache[0].blocks
    row = next(b.start for b in blocks if b.rows > 1 and len(prompts[b.start]) >= 32)
    copied = engine.extract_row(row)
    mx.eval([c.state for c in copied])
    before = mx.get_active_memory()
    views = engine.extract_row(row, views=True)
    mx.eval([c.state for c in views])
    assert mx.get_active_memory() - before < 0.05 * cache_bytes(
        model, make_prompt_cache(model), 1, len(prompts[row]))[0]
    for c, d in zip(copied, views):
        np.testing.assert_array_equal(np.array(c.state[0]), np.array(d.state[0]))
        np.testing.assert_array_equal(np.array(c.state[1]), np.array(d.state[1]))
    tokens = prompts[row] + alone[row][0][:3]
    store = BlockStore(b"views", block_size=16)
    before = mx.get_active_memory()
    assert store.insert(tokens, views) == len(tokens) // 16
    assert mx.get_active_memory() - before >= 0.9 * store.nbytes  # copies, not slices
    del views
    more, _, _ = _decode(engine, y, 2)
    for r, want in enumerate(alone):
        assert more[r][1:] == want[0][3:5]
    hit = store.lookup(tokens)
    for c, d in zip(hit.cache, copied):
        np.testing.assert_array_equal(np.array(c.state[0]), np.array(d.state[0][..., :hit.cache[0].size, :]))


def test_blocks_merged_at_a_join_are_copied_one_layer_at_a_time(smol):
    # Two long rows joining merge into one block (one attention call). The copy is made
    # at the join, layer by layer, and the joining batch lets its arrays go first: the
    # merged rows never sit twice in memory (left lazy, every layer's copy was made
    # beside all the originals, 0.3 GB over a server's KV bound at 2,000 tokens).
    model, prompts, alone = smol
    first, y1 = _batch(model, [prompts[6]])
    second, y2 = _batch(model, [prompts[7]])
    _, _, y1 = _decode(first, y1, 1)
    mx.eval(y1, y2)
    held = first.nbytes + second.nbytes
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    first.extend(second)
    del second
    mx.eval([(b.keys, b.values) for c in first.cache for b in c.blocks])
    assert len(first.cache[0].blocks) == 1  # merged
    assert mx.get_peak_memory() - before < 0.2 * held
    tokens, _, _ = _decode(first, mx.concatenate([y1, y2]), 2)
    assert tokens[0][1:] == alone[6][0][2:4] and tokens[1][1:] == alone[7][0][1:3]


def test_rows_with_only_a_last_token_join_their_blocks(smol, float_models):
    # One-token prompts have nothing before their last column, so no prefill group
    # writes them; placed after the others (unsorted rows), they get their block at the
    # last column's call, grouped (shared attention) or not (a layer that fetches every
    # row at once turns the blocks into the rectangle).
    model, prompts, alone = smol
    one = [prompts[0][-1:]]
    rows = [prompts[3], prompts[2], one[0]]
    engine, y = _batch(model, rows)
    tokens, logits, _ = _decode(engine, y, 3)
    assert tokens[0] == alone[3][0][:4] and tokens[1] == alone[2][0][:4]
    assert tokens[2] == _alone(model, one[0], 3)[0]


def test_fetching_every_row_covers_rows_no_block_holds():
    # Rows 0-1 prefilled from slot 1 in their own block; row 2 (a one-token prompt) has
    # none yet. A layer fetching every row at once gets the rectangle with row 2's
    # earlier slots as padding (zeros) and its new key after them.
    c = KVCache()
    c.reserve(5)
    prefix = mx.arange(12, dtype=mx.float32).reshape(2, 1, 3, 2) + 1
    RowsView(c, 0, 2, 1, 3, 4, own_block=True).update_and_fetch(prefix, prefix)
    assert c.blocks is not None and c.size == 4
    new = mx.full((3, 1, 1, 2), -1.0)
    keys, values = c.update_and_fetch(new, new)
    assert c.blocks is None and keys.shape == (3, 1, 5, 2)
    want = np.zeros((3, 1, 5, 2), np.float32)
    want[:2, :, 1:4] = np.array(prefix)
    want[:, :, 4] = -1
    np.testing.assert_array_equal(np.array(keys), want)
    np.testing.assert_array_equal(np.array(values), want)
