"""Hand-checked masks: padding, windows, chunks, and the caches' key layouts."""

import mlx_lm_batched  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import numpy as np

from mlx_lm_batched.models.cache import KVCache, RotatingKVCache
from mlx_lm_batched.layers.masks import attention_mask, causal_mask, masks_for_layers


def as_np(mask):
    return np.array(mask).astype(int)


def test_causal_mask_with_left_padding():
    # Row 0 has no padding, row 1 two pad columns (its first real token is column 2).
    m = as_np(causal_mask(4, mx.array([0, -2])))
    assert m.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(
        m[0, 0], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    )
    # Pad queries see only themselves (no NaN); real queries never see pads.
    np.testing.assert_array_equal(
        m[1, 0], [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    )


def test_window_limits_lookback():
    m = as_np(causal_mask(5, mx.array([0]), window=2))
    np.testing.assert_array_equal(
        m[0, 0],
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]],
    )


def test_window_counts_positions_not_padding():
    # Row 1 is padded by one slot: its window of 2 reaches back over real tokens only.
    m = as_np(causal_mask(4, mx.array([0, -1]), window=2))
    np.testing.assert_array_equal(
        m[1, 0], [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    )


def test_decode_chunk_after_cache():
    # Three slots cached; two new queries; row 1 has one pad slot (offset = 3 - 1 = 2).
    m = as_np(attention_mask(mx.arange(5), 3, 2, mx.array([3, 2])))
    np.testing.assert_array_equal(m[0, 0], [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(m[1, 0], [[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]])


def test_rotating_cache_key_slots_after_wrap():
    c = RotatingKVCache(max_size=4)
    kv = lambda n: mx.zeros((1, 1, n, 2))
    c.update_and_fetch(kv(3), kv(3))
    np.testing.assert_array_equal(np.array(c.key_slots(1)), [0, 1, 2, 3])
    c.update_and_fetch(kv(1), kv(1))
    # Next decode writes slot 4 into ring index 0.
    np.testing.assert_array_equal(np.array(c.key_slots(1)), [4, 1, 2, 3])
    c.update_and_fetch(kv(1), kv(1))
    np.testing.assert_array_equal(np.array(c.key_slots(1)), [4, 5, 2, 3])
    # A chunk of 3 sees the 3 slots before it plus itself, in time order.
    np.testing.assert_array_equal(np.array(c.key_slots(3)), [2, 3, 4, 5, 6, 7])
    keys, _ = c.update_and_fetch(kv(3), kv(3))
    assert keys.shape[2] == 6 and c.size == 8


def test_rotating_cache_returns_values_in_slot_order():
    c = RotatingKVCache(max_size=3)
    for s in range(7):
        slots = np.array(c.key_slots(1))
        k = mx.full((1, 1, 1, 1), float(s))
        keys, _ = c.update_and_fetch(k, k)
        # Every returned key holds exactly the slot key_slots promised.
        np.testing.assert_array_equal(np.array(keys)[0, 0, :, 0], slots)


def test_masks_for_layers_shares_per_layout():
    caches = [KVCache(), RotatingKVCache(2), RotatingKVCache(2)]
    masks = masks_for_layers(caches, [None, 2, 2], 3, mx.array([0, -1]))
    assert masks[1] is masks[2] and masks[0] is not masks[1]
    assert masks[0].shape == (2, 1, 3, 3)


def test_cache_extend_and_filter_keep_rows():
    a, b = KVCache(), KVCache()
    a.update_and_fetch(mx.ones((1, 1, 2, 2)), mx.ones((1, 1, 2, 2)))
    b.update_and_fetch(mx.full((1, 1, 4, 2), 2.0), mx.full((1, 1, 4, 2), 2.0))
    pads = a.extend(b)
    assert pads == (2, 0) and a.size == 4 and a.keys.shape[0] == 2
    np.testing.assert_array_equal(np.array(a.state[0])[0, 0, :, 0], [0, 0, 1, 1])
    a.filter([1])
    np.testing.assert_array_equal(np.array(a.state[0])[0, 0, :, 0], [2, 2, 2, 2])


def test_rotating_extend_aligns_time():
    a, b = RotatingKVCache(3), RotatingKVCache(3)
    for s in range(5):
        a.update_and_fetch(mx.full((1, 1, 1, 1), float(s)), mx.zeros((1, 1, 1, 1)))
    b.update_and_fetch(mx.full((1, 1, 1, 1), 9.0), mx.zeros((1, 1, 1, 1)))
    pads = a.extend(b)
    assert pads == (0, 4) and a.size == 5
    slots = np.array(a.key_slots(1))  # next write goes to slot 5
    keys, _ = a.update_and_fetch(mx.full((2, 1, 1, 1), 5.0), mx.zeros((2, 1, 1, 1)))
    row0 = dict(zip(slots.tolist(), np.array(keys)[0, 0, :, 0].tolist()))
    row1 = dict(zip(slots.tolist(), np.array(keys)[1, 0, :, 0].tolist()))
    assert row0 == {3: 3.0, 4: 4.0, 5: 5.0}
    assert row1 == {3: 0.0, 4: 9.0, 5: 5.0}


def kv_rows(rows):
    """``(B, 1, L, 1)`` keys whose values mark each slot."""
    return mx.array(rows, dtype=mx.float32)[:, None, :, None]


def test_shifted_write_moves_pad_columns_before_cached_slots():
    # Row 1's chunk starts with one pad column (-1): it goes before the row's cached
    # slots, so its cached and new tokens stay contiguous (its padding grows by one).
    c = KVCache()
    c.update_and_fetch(kv_rows([[1, 2], [3, 4]]), kv_rows([[1, 2], [3, 4]]))
    k = kv_rows([[5, 6, 7], [-1, 8, 9]])
    keys, values = c.update_shifted(k, k, mx.array([0, 1]))
    np.testing.assert_array_equal(np.array(keys)[:, 0, :, 0], [[1, 2, 5, 6, 7], [-1, 3, 4, 8, 9]])
    assert c.size == 5 and np.array_equal(np.array(values), np.array(keys))


def test_shifted_write_into_a_ring_keeps_each_rows_window():
    c = RotatingKVCache(max_size=4)
    for s in range(5):  # slots 0..4, wrapped
        c.update_and_fetch(kv_rows([[s], [10 + s]]), kv_rows([[s], [10 + s]]))
    slots = np.array(c.key_slots(3))
    k = kv_rows([[5, 6, 7], [-1, -1, 15]])
    keys, _ = c.update_shifted(k, k, mx.array([0, 2]))
    got = np.array(keys)[:, 0, :, 0]
    # The chunk sees the max_size - 1 slots before it plus itself, in slot order.
    assert slots.tolist() == [2, 3, 4, 5, 6, 7]
    np.testing.assert_array_equal(got[0], [2, 3, 4, 5, 6, 7])
    # Row 1 moved two slots later: its old slot 1 (11) is slot 3 now, slot 2 holds
    # a pad column; its new token (slot 7) still has its whole window of 4 slots.
    np.testing.assert_array_equal(got[1], [-1, 11, 12, 13, 14, 15])
    # The ring keeps the last 4 slots of each row's new frame.
    np.testing.assert_array_equal(np.array(c.ordered()[0])[:, 0, :, 0], [[4, 5, 6, 7], [12, 13, 14, 15]])
