"""Causal key trimming in the CPU attention (``masks.CausalMask``, ``cpu_ops.attention``).

Masks built over keys in slot order come back typed as causal; the CPU attention then
reads, for each block of queries, only the keys up to its last query's (and, with a
sliding window, from its first query's window start). Checked here:
which masks make that claim (and that it holds), the key extents each block reads, and
that real models' decoder stacks give the same outputs as with the very same masks as plain arrays, in
a left-padded batch, in chunks after cached tokens, and over Gemma 3's sliding-window
rings once they wrap.
"""

import mlx_lm_batched  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched.layers import cpu_ops
from mlx_lm_batched.layers.masks import CausalMask, attention_mask, causal_mask, masks_for_layers
from mlx_lm_batched.models.cache import KVCache, RotatingKVCache


def _feed(cache, n):
    cache.update_and_fetch(mx.zeros((1, 1, n, 2)), mx.zeros((1, 1, n, 2)))


def _mask(cache, query_len, window=None):
    return masks_for_layers([cache], [window], query_len, mx.array([cache.size]))[0]


def _assert_no_key_after_own(mask):
    """The claim a CausalMask makes: query i attends no key after index K - L + i, and
    with a window none before K - L + i - window + 1."""
    m = np.array(mask)
    L, K = m.shape[-2:]
    own = (K - L + np.arange(L))[:, None]
    outside = np.arange(K)[None, :] > own
    if mask.window:
        outside |= np.arange(K)[None, :] < own - mask.window + 1
    assert not m[..., outside].any()


def test_masks_claim_slot_order_only_where_keys_are_in_order():
    kv = KVCache()
    assert isinstance(_mask(kv, 5), CausalMask)
    _feed(kv, 5)
    assert isinstance(_mask(kv, 3), CausalMask)  # a chunk after cached slots
    _assert_no_key_after_own(_mask(kv, 3))

    ring = RotatingKVCache(4)
    assert isinstance(_mask(ring, 3), CausalMask)
    _feed(ring, 6)  # wrapped: a multi-token chunk still gets its keys in slot order
    chunk = _mask(ring, 2)
    assert isinstance(chunk, CausalMask) and chunk.shape[-1] == 3 + 2
    assert chunk.window == 4  # the ring's size bounds what a query sees
    _assert_no_key_after_own(chunk)
    windowed = _mask(ring, 2, window=2)
    assert windowed.window == 2
    _assert_no_key_after_own(windowed)
    # A decode step over a full ring reads the ring as stored: not in slot order.
    step = _mask(ring, 1)
    assert type(step) is mx.array
    assert type(_mask(RotatingKVCache(8, keep=4), 3)) is mx.array  # sinks first

    m = causal_mask(6, mx.array([0, -2]), window=3)
    assert isinstance(m, CausalMask) and m.window == 3
    _assert_no_key_after_own(m)
    assert causal_mask(6, mx.array([0])).window is None
    # Any op on the mask claims nothing: a slice or a combination is a plain array.
    assert type(m[..., 1:, :]) is mx.array and type(m & m) is mx.array


@pytest.mark.parametrize("window", [None, 100])
def test_each_query_block_reads_keys_up_to_its_last_query(monkeypatch, window):
    B, H, n_kv, L, before, D = 2, 6, 2, 150, 30, 16
    S = before + L
    rng = np.random.default_rng(0)
    q = mx.array(rng.standard_normal((B, H, L, D)), dtype=mx.float32)
    k = mx.array(rng.standard_normal((B, n_kv, S, D)), dtype=mx.float32)
    v = mx.array(rng.standard_normal((B, n_kv, S, D)), dtype=mx.float32)
    plain = attention_mask(mx.arange(S), before, L, mx.array([before, before - 20]), window)
    reference = cpu_ops.attention(q, k, v, 0.25, plain)

    extents = []
    inner = cpu_ops._attention

    def spy(q_block, k_block, *args):
        extents.append((q_block.shape[2], k_block.shape[2]))
        return inner(q_block, k_block, *args)

    monkeypatch.setattr(cpu_ops, "_attention", spy)
    out = cpu_ops.attention(q, k, v, 0.25, CausalMask(plain, window))
    block = cpu_ops.CAUSAL_QUERY_BLOCK
    stops = list(range(block, L, block)) + [L]
    # Keys from the block's first query's window start to its last query's own key.
    firsts = [max(0, before + start - window + 1) if window else 0
              for start in [0] + stops[:-1]]
    assert extents == [(stop - start, before + stop - first)
                       for start, stop, first in zip([0] + stops[:-1], stops, firsts)]
    assert window is None or firsts[-1] > 0  # the last block skips leading keys
    np.testing.assert_allclose(np.array(out), np.array(reference), rtol=1e-5, atol=1e-6)


def _hidden(model, tokens, offset, caches, plain):
    """The decoder stack's output for one call on ``tokens`` (the LM head reads nothing
    else), under the masks the model builds; with ``plain`` the same masks as plain
    arrays (no key trimming)."""
    masks = masks_for_layers(caches, model.layer_windows, tokens.shape[1], offset)
    assert any(isinstance(m, CausalMask) for m in masks)
    if plain:
        masks = [mx.array(m) for m in masks]
        assert not any(isinstance(m, CausalMask) for m in masks)
    out = model.model(tokens, masks, offset, caches)
    mx.eval(out, [c.state for c in caches])
    return np.array(out)


def _chunked_hidden(model, tokens, padding, cuts, plain):
    caches = model.make_cache()
    offset = -mx.array(padding, dtype=mx.int32)
    outs, start = [], 0
    for stop in cuts + [tokens.shape[1]]:
        outs.append(_hidden(model, tokens[:, start:stop], offset + start, caches, plain))
        start = stop
    return np.concatenate(outs, axis=1)


@pytest.mark.parametrize("name, lengths, cuts", [
    ("smollm2", [300, 170, 45], [200]),  # left-padded batch; a chunk after cached slots
    ("gemma3", [700], [600]),  # sliding-window rings of 512 slots, wrapped by each chunk
])
def test_trimmed_attention_gives_the_outputs_of_full_attention(float_models, name, lengths,
                                                               cuts):
    model, tokenizer = float_models[name]
    prompts = corpus_prompts(tokenizer, lengths)
    width = max(lengths)
    padding = [width - n for n in lengths]
    tokens = mx.array([[0] * p + t for p, t in zip(padding, prompts)], dtype=mx.int32)
    trimmed = _chunked_hidden(model, tokens, padding, cuts, plain=False)
    full = _chunked_hidden(model, tokens, padding, cuts, plain=True)
    for row, pad in enumerate(padding):
        real_t, real_f = trimmed[row, pad:], full[row, pad:]
        assert np.isfinite(real_t).all()
        np.testing.assert_allclose(real_t, real_f, rtol=0, atol=1e-5 * np.abs(real_f).max())
