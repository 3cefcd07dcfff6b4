"""mlx-lm 0.32's module-level functions and classes that code written for mlx-lm imports
(``models.ssm``, ``models.gated_delta``, ``models.rope_utils``, ``models.activations``,
``models.switch_layers``, ``models.base``, ``models.cache``, ``utils``, ...), called
with the same arguments as mlx-lm's own and compared with their results. mlx-lm is the
oracle (its CPU ops path); the package never imports it."""

import mlx.core as mx
import mlx_lm.models.gated_delta as lm_gd
import mlx_lm.models.ssm as lm_ssm
import numpy as np
import pytest

from mlx_lm_batched.models import gated_delta as our_gd
from mlx_lm_batched.models import ssm as our_ssm


def close(theirs, ours, atol=2e-5, rtol=2e-5):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.shape, theirs.shape,
                                                                        ours.dtype, theirs.dtype)
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)),
                               np.array(theirs.astype(mx.float32)), atol=atol, rtol=rtol)


def left_padding_mask(pads, n):
    return mx.arange(n)[None, :] >= mx.array(pads)[:, None]


# --- models.ssm ---------------------------------------------------------------------

def ssm_inputs(seed, b=3, n=7, h=4, p=5, g=2, d=6, dtype=mx.float32):
    keys = mx.random.split(mx.random.key(seed), 8)
    x = mx.random.normal((b, n, h, p), key=keys[0]).astype(dtype)
    A_log = mx.random.uniform(-1.0, 1.0, (h,), key=keys[1])
    B = mx.random.normal((b, n, g, d), key=keys[2]).astype(dtype)
    C = mx.random.normal((b, n, g, d), key=keys[3]).astype(dtype)
    D = mx.random.normal((h,), key=keys[4])
    dt = mx.random.normal((b, n, h), key=keys[5]).astype(dtype)
    dt_bias = mx.random.normal((h,), key=keys[6])
    state = mx.random.normal((b, h, p, d), key=keys[7])
    return x, A_log, B, C, D, dt, dt_bias, state


def test_compute_dt_and_segsum_match_mlx_lm():
    x, _, _, _, _, dt, dt_bias, _ = ssm_inputs(0)
    for limit in ((0.001, 100.0), (0.5, 1.5), (0.0, float("inf"))):
        close(lm_ssm.compute_dt(dt, dt_bias, limit), our_ssm.compute_dt(dt, dt_bias, limit))
    seq = mx.random.normal((3, 4, 9), key=mx.random.key(1))
    close(lm_ssm.segsum(seq), our_ssm.segsum(seq))
    mask = left_padding_mask([0, 2, 5], 9)
    close(lm_ssm.segsum(seq, mask), our_ssm.segsum(seq, mask))
    assert np.isneginf(np.array(our_ssm.segsum(seq, mask))[2, 0, 3, 1])


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("padding", ["none", "left", "lengths"])
def test_ssm_attn_and_update_match_mlx_lm(with_state, padding):
    """Outputs at every real column and the final state, with a cached state or none,
    left padding (mlx-lm's ``ArraysCache`` mask) or right padding (``lengths`` with the
    mask ``make_mask`` builds from them)."""
    x, A_log, B, C, D, dt, dt_bias, state = ssm_inputs(2)
    b, n = x.shape[:2]
    state = state if with_state else None
    mask = lengths = None
    real = np.ones((b, n), bool)
    if padding == "left":
        mask = left_padding_mask([0, 3, 6], n)
    elif padding == "lengths":
        lengths = mx.array([7, 4, 1])
        mask = mx.arange(n)[None, :] < lengths[:, None]
    if mask is not None:
        real = np.array(mask)
    limit = (0.001, 100.0)
    for fn in ("ssm_attn", "ssm_update"):
        y0, s0 = getattr(lm_ssm, fn)(x, A_log, B, C, D, dt, dt_bias, state, limit,
                                     mask=mask, lengths=lengths)
        y1, s1 = getattr(our_ssm, fn)(x, A_log, B, C, D, dt, dt_bias, state, limit,
                                      mask=mask, lengths=lengths)
        assert y1.shape == y0.shape and y1.dtype == y0.dtype
        np.testing.assert_allclose(np.array(y1)[real], np.array(y0)[real], atol=1e-4, rtol=1e-4)
        close(s0, s1, atol=1e-4, rtol=1e-4)


def test_ssm_chunked_steps_and_the_kernel_entry_agree_with_one_call():
    """mlx-lm's ``step`` (chunk size) and a prefill continued token by token through
    ``ssm_update_kernel`` give the one-call result; ``make_ssm_kernel`` is None here,
    as mlx-lm's is without Metal."""
    x, A_log, B, C, D, dt, dt_bias, state = ssm_inputs(3, n=9)
    y0, s0 = lm_ssm.ssm_attn(x, A_log, B, C, D, dt, dt_bias, state, step=4)
    y1, s1 = our_ssm.ssm_attn(x, A_log, B, C, D, dt, dt_bias, state, step=4)
    close(y0, y1, atol=1e-4, rtol=1e-4)
    close(s0, s1, atol=1e-4, rtol=1e-4)
    s, ys = state, []
    for t in range(x.shape[1]):
        sl = slice(t, t + 1)
        y, s = our_ssm.ssm_update_kernel(x[:, sl], A_log, B[:, sl], C[:, sl], D, dt[:, sl],
                                         dt_bias, s, (0.001, 100.0))
        ys.append(y)
    assert ys[0].dtype == x.dtype and s.dtype == state.dtype
    np.testing.assert_allclose(np.array(mx.concatenate(ys, axis=1)), np.array(y0.astype(x.dtype)),
                               atol=1e-4, rtol=1e-4)
    close(s0, s, atol=1e-4, rtol=1e-4)
    assert our_ssm.make_ssm_kernel() is None


def test_ssm_attn_bfloat16_inputs_keep_mlx_lm_dtypes():
    x, A_log, B, C, D, dt, dt_bias, _ = ssm_inputs(4, dtype=mx.bfloat16)
    y0, s0 = lm_ssm.ssm_attn(x, A_log, B, C, D, dt, dt_bias)
    y1, s1 = our_ssm.ssm_attn(x, A_log, B, C, D, dt, dt_bias)
    close(y0, y1, atol=0.05, rtol=0.02)
    close(s0, s1, atol=1e-3, rtol=1e-3)


# --- models.gated_delta ---------------------------------------------------------------

def delta_inputs(seed, b=3, t=6, hk=2, hv=4, dk=8, dv=5, vector_g=False):
    keys = mx.random.split(mx.random.key(seed), 9)
    q = mx.random.normal((b, t, hk, dk), key=keys[0])
    k = mx.random.normal((b, t, hk, dk), key=keys[1])
    q, k = lm_gd.normalize_qk(q, k, inv_scale=dk ** -0.5, eps=1e-6)
    v = mx.random.normal((b, t, hv, dv), key=keys[2])
    a = mx.random.normal((b, t, hv, dk) if vector_g else (b, t, hv), key=keys[3])
    bb = mx.random.normal((b, t, hv), key=keys[4])
    A_log = mx.random.uniform(-1.0, 1.0, (hv, 1) if vector_g else (hv,), key=keys[5])
    dt_bias = mx.random.normal((hv, dk) if vector_g else (hv,), key=keys[6])
    state = mx.random.normal((b, hv, dv, dk), key=keys[7]) * 0.3
    return q, k, v, a, bb, A_log, dt_bias, state


def test_compute_g_and_normalize_qk_match_mlx_lm():
    _, _, _, a, _, A_log, dt_bias, _ = delta_inputs(0)
    close(lm_gd.compute_g(A_log, a, dt_bias), our_gd.compute_g(A_log, a, dt_bias))
    for bound in (-5.0, -0.5):
        close(lm_gd.compute_lower_bound_g(A_log, a, dt_bias, bound),
              our_gd.compute_lower_bound_g(A_log, a, dt_bias, bound))
    keys = mx.random.split(mx.random.key(1), 2)
    q, k = (mx.random.normal((2, 3, 4, 16), key=key) for key in keys)
    for inv_scale, eps in ((16 ** -0.5, 1e-6), (0.3, 1e-2)):
        for dtype in (mx.float32, mx.bfloat16):
            theirs = lm_gd.normalize_qk(q.astype(dtype), k.astype(dtype), inv_scale=inv_scale,
                                        eps=eps)
            ours = our_gd.normalize_qk(q.astype(dtype), k.astype(dtype), inv_scale=inv_scale,
                                       eps=eps)
            tol = 1e-5 if dtype == mx.float32 else 1e-2
            for x0, x1 in zip(theirs, ours):
                close(x0, x1, atol=tol, rtol=tol)


@pytest.mark.parametrize("vector_g", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_gated_delta_update_and_ops_match_mlx_lm(vector_g, with_state, masked):
    """Scalar and per-channel (Kimi) gates, grouped heads, a cached state or none, a left
    padding mask; the Kimi K3 lower bound and beta in [0, 2]. Masked columns leave the
    state as it was and output 0 here (mlx-lm's Metal kernels' value; its ops path
    returns a discarded read), so outputs are compared at real columns."""
    q, k, v, a, b, A_log, dt_bias, state = delta_inputs(2, vector_g=vector_g)
    state = state if with_state else None
    mask = left_padding_mask([0, 2, 5], q.shape[1]) if masked else None
    real = np.array(mask) if masked else np.ones(q.shape[:2], bool)
    for extra in ({}, {"lower_bound": -3.0}, {"allow_neg_eigval": True}):
        y0, s0 = lm_gd.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask, **extra)
        y1, s1 = our_gd.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask, **extra)
        assert y1.shape == y0.shape and y1.dtype == y0.dtype
        np.testing.assert_allclose(np.array(y1)[real], np.array(y0)[real], atol=1e-5, rtol=1e-4)
        close(s0, s1, atol=1e-5, rtol=1e-4)
        if masked:
            assert not np.array(y1)[~real].any()
    g = lm_gd.compute_g(A_log, a, dt_bias)
    beta = mx.sigmoid(b)
    y0, s0 = lm_gd.gated_delta_ops(q, k, v, g, beta, state, mask)
    y1, s1 = our_gd.gated_delta_ops(q, k, v, g, beta, state, mask)
    np.testing.assert_allclose(np.array(y1)[real], np.array(y0)[real], atol=1e-5, rtol=1e-4)
    close(s0, s1, atol=1e-5, rtol=1e-4)
    if state is not None:  # the kernel entries: same results, the kernels' dtypes
        for name in ("gated_delta_kernel", "gated_delta_kernel_unpacked"):
            y2, s2 = getattr(our_gd, name)(q, k, v, g, beta, state, mask)
            assert np.array_equal(np.array(y2), np.array(y1)) and s2.dtype == state.dtype
            close(s0, s2, atol=1e-5, rtol=1e-4)


def test_gated_delta_state_carries_across_calls_like_one_call():
    """A prompt split in two calls (the state handed from the first to the second)
    gives mlx-lm's one-call outputs and state."""
    q, k, v, a, b, A_log, dt_bias, _ = delta_inputs(5, t=8)
    y0, s0 = lm_gd.gated_delta_update(q, k, v, a, b, A_log, dt_bias)
    ya, s = our_gd.gated_delta_update(q[:, :3], k[:, :3], v[:, :3], a[:, :3], b[:, :3], A_log,
                                      dt_bias)
    yb, s = our_gd.gated_delta_update(q[:, 3:], k[:, 3:], v[:, 3:], a[:, 3:], b[:, 3:], A_log,
                                      dt_bias, s)
    close(y0, mx.concatenate([ya, yb], axis=1), atol=1e-5, rtol=1e-4)
    close(s0, s, atol=1e-5, rtol=1e-4)


# --- models.rope_utils, models.activations, models.switch_layers ----------------------

ROPE_CASES = [
    ("Llama3RoPE", dict(dims=16, max_position_embeddings=2048, traditional=False, base=500000.0,
                        scaling_config={"factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64})),
    ("SuScaledRoPE", dict(dims=16, base=10000.0, max_position_embeddings=8192,
                          original_max_position_embeddings=512,
                          short_factor=[1.0] * 8, long_factor=[1.0 + i / 4 for i in range(8)])),
    ("SuScaledRoPE", dict(dims=16, long_factor=2.0, long_mscale=1.3)),
    ("YarnRoPE", dict(dims=16, traditional=True, max_position_embeddings=4096, base=10000,
                      scaling_factor=4.0, original_max_position_embeddings=1024, beta_fast=32,
                      beta_slow=1, mscale=0.707, mscale_all_dim=0.707)),
    ("YarnRoPE", dict(dims=12, scaling_factor=2.0, mscale=1.2)),
    ("ProportionalRoPE", dict(dims=16, rotated_dims=8, base=10000.0, factor=2.0)),
    ("DynamicNTKScalingRoPE", dict(dims=16, max_position_embeddings=8, traditional=False,
                                   base=10000.0, factor=2.0)),
]


@pytest.mark.parametrize("name,kwargs", ROPE_CASES)
def test_rope_classes_match_mlx_lm(name, kwargs):
    """Each class built with mlx-lm's arguments rotates a (B, H, L, D) array as mlx-lm's
    does, with the default offset, an int offset, and (where mlx-lm takes one) a (B,)
    offset array; a partial rotary width leaves the other features alone."""
    import mlx_lm.models.rope_utils as lm_rope

    from mlx_lm_batched.models import rope_utils
    theirs, ours = getattr(lm_rope, name)(**kwargs), getattr(rope_utils, name)(**kwargs)
    x = mx.random.normal((2, 3, 5, 20), key=mx.random.key(7))
    offsets = [None, 3, 40]
    if name != "DynamicNTKScalingRoPE":  # mlx-lm's takes an int offset only
        offsets.append(mx.array([2, 9]))
    for offset in offsets:
        args = () if offset is None else (offset,)
        close(theirs(x, *args), ours(x, *args), atol=2e-5, rtol=2e-5)
    if name == "YarnRoPE":
        for extra in ({"inverse": True}, {"scale": 0.5}):
            close(theirs(x, 4, **extra), ours(x, 4, **extra), atol=2e-5, rtol=2e-5)


def test_apply_yarn_mscale_matches_mlx_lm():
    import mlx_lm.models.rope_utils as lm_rope

    from mlx_lm_batched.models import rope_utils
    for cfg in (None, {}, {"rope_type": "default", "factor": 4, "mscale_all_dim": 1.0},
                {"type": "yarn", "factor": 40, "mscale_all_dim": 0.707},
                {"rope_type": "yarn", "factor": 0.5, "mscale_all_dim": 1.0},
                {"rope_type": "deepseek_yarn", "factor": 4}):
        assert rope_utils.apply_yarn_mscale(0.125, cfg) == pytest.approx(
            lm_rope.apply_yarn_mscale(0.125, cfg), rel=1e-12)


def test_activations_and_swiglu_module_match_mlx_lm():
    import mlx_lm.models.activations as lm_act
    import mlx_lm.models.switch_layers as lm_switch

    from mlx_lm_batched.models import activations, switch_layers
    keys = mx.random.split(mx.random.key(8), 2)
    gate, x = (mx.random.normal((4, 33), key=key) * 5 for key in keys)
    close(lm_act.swiglu_oai(gate, x), activations.swiglu_oai(gate, x))
    close(lm_act.swiglu_oai(gate, x, 1.3, 3.0), activations.swiglu_oai(gate, x, 1.3, 3.0))
    close(lm_act.SwigluOAI(1.5, 4.0)(x, gate), activations.SwigluOAI(1.5, 4.0)(x, gate))
    h = x.astype(mx.bfloat16)
    close(lm_act.precise_swiglu(h, gate, x), activations.precise_swiglu(h, gate, x),
          atol=1e-2, rtol=1e-2)
    close(lm_switch.SwiGLU()(x, gate), switch_layers.SwiGLU()(x, gate), atol=1e-5, rtol=1e-5)
    close(lm_switch.swiglu(gate, x), switch_layers.swiglu(gate, x), atol=1e-5, rtol=1e-5)
    for kwargs in ({}, {"alpha_p_init": 0.3, "alpha_n_init": 1.1, "beta": 0.25, "eps": -1e-4}):
        theirs, ours = lm_act.XieLU(**kwargs), activations.XieLU(**kwargs)
        close(theirs(x), ours(x), atol=1e-4, rtol=1e-5)
        for name in ("alpha_p", "alpha_n", "beta", "eps"):
            close(getattr(theirs, name), getattr(ours, name), atol=1e-6, rtol=1e-6)
        close(lm_act.xielu(x, theirs.alpha_p, theirs.alpha_n, theirs.beta, theirs.eps),
              activations.xielu(x, theirs.alpha_p, theirs.alpha_n, theirs.beta, theirs.eps),
              atol=1e-4, rtol=1e-5)


# --- models.base and models.cache helpers ----------------------------------------------

def test_cache_helpers_match_mlx_lm():
    """dynamic_roll, TokenBuffer, ConcatenateKVCache and create_causal_mask from
    ``models.cache`` give mlx-lm's arrays, step by step."""
    import mlx_lm.models.cache as lm_cache

    from mlx_lm_batched.models import cache as our_cache
    x = mx.random.normal((3, 2, 7, 4), key=mx.random.key(9))
    for axis, shifts in ((1, mx.array([0, 1, -3])), (2, mx.array([[2, 5], [0, -1], [7, 13]]))):
        assert np.array_equal(np.array(our_cache.dynamic_roll(x, shifts, axis)),
                              np.array(lm_cache.dynamic_roll(x, shifts, axis)))
    theirs, ours = lm_cache.TokenBuffer([5, 6]), our_cache.TokenBuffer([5, 6])
    for chunk in (mx.array([1, 2, 3]), mx.arange(300), mx.array([7])):
        assert np.array_equal(np.array(ours.update_and_fetch(chunk)),
                              np.array(theirs.update_and_fetch(chunk)))
        assert ours.state.shape == theirs.state.shape
        assert np.array_equal(np.array(ours.tokens), np.array(theirs.tokens))
    theirs, ours = lm_cache.ConcatenateKVCache(), our_cache.ConcatenateKVCache()
    assert ours.empty() and theirs.empty()
    for n, key in ((5, 10), (1, 11), (3, 12)):
        keys = mx.random.normal((2, 2, n, 4), key=mx.random.key(key))
        values = keys * 2 + 1
        for a, b in zip(theirs.update_and_fetch(keys, values), ours.update_and_fetch(keys, values)):
            assert np.array_equal(np.array(a), np.array(b))
        assert ours.offset == theirs.offset
        for a, b in zip(theirs.state, ours.state):
            assert np.array_equal(np.array(a), np.array(b))
    for args in ((4,), (3, 5), (3, 5, 2)):
        assert np.array_equal(np.array(our_cache.create_causal_mask(*args)),
                              np.array(lm_cache.create_causal_mask(*args)))
    # Left padding: the real queries' rows are mlx-lm's (a padding query here sees its
    # own slot instead of nothing, so it never gets NaN).
    pads = mx.array([0, 2, 1])
    ours_m = np.array(our_cache.create_causal_mask(4, 2, None, None, pads))
    theirs_m = np.array(lm_cache.create_causal_mask(4, 2, None, None, pads))
    assert ours_m.shape == theirs_m.shape == (3, 1, 4, 6)
    for row, pad in enumerate([0, 2, 1]):
        real = slice(max(0, pad - 2), None)
        assert np.array_equal(ours_m[row, 0, real], theirs_m[row, 0, real])
    with pytest.raises(NotImplementedError, match="sched.prefix_cache.LRUPromptCache"):
        our_cache.LRUPromptCache(max_size=4)


def test_prompt_trie_matches_mlx_lm_on_random_sequences():
    """Random stored sequences over a small vocabulary (so prefixes and branches
    collide): every search, get, pop and pop_prefixes answers as mlx-lm's trie."""
    import mlx_lm.models.cache as lm_cache

    from mlx_lm_batched.models import cache as our_cache
    rng = np.random.default_rng(0)
    theirs, ours = lm_cache.PromptTrie(), our_cache.PromptTrie()

    def seq():
        return [int(t) for t in rng.integers(0, 3, rng.integers(0, 6))]

    def fields(result):
        return (result.model, result.exact, result.shorter, result.longer, result.common_prefix)

    stored = []
    for i in range(40):
        tokens, model = seq(), ["a", "b"][i % 2]
        assert ours.add(model, tokens, i) == theirs.add(model, tokens, i)
        stored.append((model, tokens))
    for _ in range(200):
        model, tokens = ["a", "b", "c"][rng.integers(0, 3)], seq()
        assert fields(ours.search(model, tokens)) == fields(theirs.search(model, tokens))
    for model, tokens in stored[::3]:
        try:
            expected = theirs.get(model, tokens)
        except KeyError:
            continue
        assert ours.get(model, tokens) == expected
        assert ours.pop(model, tokens) == theirs.pop(model, tokens)
    def outcome(fn, *args):
        try:
            return fn(*args)
        except KeyError:  # a path pruned by an earlier pop: both raise
            return KeyError

    for model, tokens in stored[1::4]:
        assert outcome(ours.pop_prefixes, model, tokens) == outcome(theirs.pop_prefixes, model,
                                                                    tokens)
    for _ in range(200):
        model, tokens = ["a", "b"][rng.integers(0, 2)], seq()
        assert fields(ours.search(model, tokens)) == fields(theirs.search(model, tokens))


def test_create_ssm_mask_and_gather_last_axis_match_mlx_lm():
    import mlx_lm.models.base as lm_base
    import mlx_lm.models.cache as lm_cache

    from mlx_lm_batched.models import base
    from mlx_lm_batched.models import cache as our_cache
    h = mx.zeros((2, 5, 8))
    padded = lm_cache.ArraysCache(2, left_padding=[0, 3])
    assert np.array_equal(np.array(base.create_ssm_mask(h, padded)),
                          np.array(lm_base.create_ssm_mask(h, padded)))
    assert base.create_ssm_mask(h) is None and lm_base.create_ssm_mask(h) is None
    assert base.create_ssm_mask(h, our_cache.ArraysCache(2)) is None
    group = mx.distributed.init()  # one rank here: the gather is the identity
    x = mx.random.normal((2, 3, 4), key=mx.random.key(3))
    assert np.array_equal(np.array(base.gather_last_axis(x, group)),
                          np.array(lm_base.gather_last_axis(x, group)))


# --- utils ---------------------------------------------------------------------------

def test_utils_model_helpers_match_mlx_lm():
    """bits per weight (float and 4-bit), input-embedding support, the quantization a
    packed weight was saved with, and Metal's availability, as mlx-lm's utils answer
    for the same model (a tiny llama built by each library)."""
    import mlx.nn as nn
    import mlx_lm.models.llama as lm_llama
    import mlx_lm.utils as lm_utils

    from mlx_lm_batched import utils
    from mlx_lm_batched.models import llama
    config = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    ours = llama.Model(llama.ModelArgs.from_dict(config))
    theirs = lm_llama.Model(lm_llama.ModelArgs.from_dict(config))
    assert utils.compute_bits_per_weight(ours) == pytest.approx(32.0)
    assert utils.compute_bits_per_weight(theirs) == lm_utils.compute_bits_per_weight(theirs)
    nn.quantize(ours, group_size=32, bits=4)
    nn.quantize(theirs, group_size=32, bits=4)
    assert utils.compute_bits_per_weight(ours) == pytest.approx(
        lm_utils.compute_bits_per_weight(theirs), rel=1e-3)
    assert utils.does_model_support_input_embeddings(theirs) == \
        lm_utils.does_model_support_input_embeddings(theirs)
    assert utils.does_model_support_input_embeddings(ours) == \
        lm_utils.does_model_support_input_embeddings(ours)
    assert utils.can_run_metal() == lm_utils.can_run_metal()
    linear = nn.Linear(64, 48)
    for kwargs in ({"group_size": 32, "bits": 4}, {"group_size": 64, "bits": 8},
                   {"group_size": 32, "bits": 4, "mode": "mxfp4"}):
        w, scales, *biases = mx.quantize(linear.weight, **kwargs)
        weights = {"l.weight": w, "l.scales": scales}
        assert utils.infer_quant_config("l", linear, weights) == \
            lm_utils.infer_quant_config("l", linear, weights)
    with pytest.raises(NotImplementedError, match="hf upload"):
        utils.upload_to_hub("some/dir", "me/repo")


# --- modules this package does not provide ----------------------------------------------

ABSENT = {"lora": "mlx_lm.lora", "tuner": "mlx_lm.tuner", "tuner.lora": "mlx_lm.tuner",
          "quant": "mlx_lm.quant", "quant.gptq": "mlx_lm.quant", "manage": "mlx_lm.manage",
          "upload": "mlx_lm.upload", "share": "mlx_lm.share",
          "perplexity": "mlx_lm.perplexity"}


@pytest.mark.parametrize("name", sorted(ABSENT))
def test_absent_modules_fail_with_one_line_naming_the_alternative(name):
    import importlib
    import sys

    with pytest.raises(ImportError, match=ABSENT[name].replace(".", r"\.")) as info:
        importlib.import_module(f"mlx_lm_batched.{name}")
    assert "\n" not in str(info.value)
    for module in [m for m in sys.modules if m.startswith("mlx_lm_batched.") and
                   m.split(".")[1] in ("tuner", "quant")]:
        del sys.modules[module]


@pytest.mark.parametrize("name", ["lora", "tuner.lora", "quant.awq", "perplexity"])
def test_absent_modules_under_python_m_print_one_line(name):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    run = subprocess.run([sys.executable, "-m", f"mlx_lm_batched.{name}", "--help"], cwd=root,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "mlx_lm." in lines[0] and "Traceback" not in lines[0], run.stderr


# --- tokenizer_utils ---------------------------------------------------------------------

def test_newline_tokenizer_and_no_bos_or_eos_match_mlx_lm(float_dirs, tmp_path):
    """SmolLM2's tokenizer named "NewlineTokenizer" in its config: this package's loader
    finds the class, which encodes a text as the plain fast tokenizer encodes it with
    each line break written ``<n>``, and decodes back. (mlx-lm 0.32.2's own class is
    no oracle here: under transformers 5 it loses the BPE merges and encodes character
    by character.)"""
    import json
    import shutil

    import mlx_lm.tokenizer_utils as lm_tok
    from transformers import PreTrainedTokenizerFast

    from mlx_lm_batched import tokenizer_utils
    for f in float_dirs["smollm2"].iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp_path / f.name)
    plain = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "NewlineTokenizer"
    config_path.write_text(json.dumps(config))
    text = "def f(x):\n    return x\n\nprint(f(2))"
    ours = tokenizer_utils.NewlineTokenizer.from_pretrained(str(tmp_path))
    ids = ours.encode(text)
    assert ids == plain.encode(text.replace("\n", "<n>")) != plain.encode(text)
    assert ours.decode(ids) == text and plain.decode(ids) == text.replace("\n", "<n>")
    assert ours.batch_decode([ids, ids[:3]]) == [text, plain.decode(ids[:3])]
    loaded = tokenizer_utils.load(tmp_path)
    assert type(loaded._tokenizer).__name__ == "NewlineTokenizer"
    assert loaded.encode(text) == ids and loaded.decode(ids) == text
    for seq in ([1, 5, 6, 2], [5, 6, 2], [1, 5, 6], [5], [1, 2], [2, 1, 2]):
        assert tokenizer_utils.no_bos_or_eos(seq, 1, 2) == lm_tok.no_bos_or_eos(seq, 1, 2)


# --- gguf, convert and the command modules' re-exports --------------------------------------

def test_gguf_helpers_match_mlx_lm():
    import mlx_lm.gguf as lm_gguf

    from mlx_lm_batched import gguf
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
             "model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.bias",
             "model.layers.10.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
             "model.layers.0.post_attention_layernorm.weight",
             "model.layers.2.block_sparse_moe.gate.weight",
             "model.layers.2.block_sparse_moe.experts.7.w1.weight",
             "model.layers.2.block_sparse_moe.experts.7.w2.weight",
             "model.layers.2.block_sparse_moe.experts.11.w3.weight", "something.else"]
    for name in names:
        assert gguf.translate_weight_names(name) == lm_gguf.translate_weight_names(name), name
    w = mx.random.normal((48, 10), key=mx.random.key(4))
    for args in ((4,), (4, 2), (4, 4), (6, None)):
        assert np.array_equal(np.array(gguf.permute_weights(w, *args)),
                              np.array(lm_gguf.permute_weights(w, *args)))
    assert {t.name: t.value for t in gguf.TokenType} == {t.name: t.value for t in lm_gguf.TokenType}
    assert gguf.GGMLFileType.GGML_TYPE_F16 == lm_gguf.GGMLFileType.GGML_TYPE_F16 == 1


def test_convert_parser_recipes_and_reexports_match_mlx_lm():
    """configure_parser parses mlx-lm's flags into what ``convert`` takes; the mixed
    recipes give every layer of a 16-layer llama the bits mlx-lm's give; the command
    modules re-export the functions mlx-lm's do."""
    import importlib
    import inspect

    import mlx_lm.models.llama as lm_llama

    from mlx_lm_batched.models import cache, llama
    lm_convert = importlib.import_module("mlx_lm.convert")  # mlx_lm.convert is also a function
    benchmark, cache_prompt, chat, convert, fuse, generate, gguf, utils = (
        importlib.import_module(f"mlx_lm_batched.{name}") for name in (
            "benchmark", "cache_prompt", "chat", "convert", "fuse", "generate", "gguf", "utils"))
    argv = ["--hf-path", "some/model", "--mlx-path", "out", "-q", "--q-bits", "3",
            "--q-group-size", "32", "--q-mode", "affine", "--dtype", "bfloat16", "-d",
            "--trust-remote-code"]
    ours, theirs = vars(convert.configure_parser().parse_args(argv)), \
        vars(lm_convert.configure_parser().parse_args(argv))
    assert ours == {k: v for k, v in theirs.items() if k != "quant_predicate"}
    assert set(ours) <= set(inspect.signature(convert.convert).parameters)
    config = dict(model_type="llama", hidden_size=32, num_hidden_layers=16, intermediate_size=64,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    ours_m = llama.Model(llama.ModelArgs.from_dict(config))
    theirs_m = lm_llama.Model(lm_llama.ModelArgs.from_dict(config))
    paths = [name for name, module in theirs_m.named_modules() if hasattr(module, "to_quantized")]
    assert len(paths) > 16 * 7
    for recipe in lm_convert.QUANT_RECIPES:
        ours_p = convert.mixed_quant_predicate_builder(recipe, ours_m, 32)
        theirs_p = lm_convert.mixed_quant_predicate_builder(recipe, theirs_m, 32)
        assert [ours_p(p, None) for p in paths] == [theirs_p(p, None) for p in paths], recipe
    with pytest.raises(ValueError, match="Invalid quant recipe"):
        convert.mixed_quant_predicate_builder("mixed_1_8", ours_m)
    same = {convert: ["load", "save", "quantize_model", "dequantize_model", "upload_to_hub"],
            fuse: ["load", "save", "dequantize_model", "upload_to_hub"],
            chat: ["load", "sharded_load"], benchmark: ["load", "sharded_load"],
            cache_prompt: ["load"]}
    for module, names in same.items():
        for name in names:
            assert getattr(module, name) is getattr(utils, name), (module.__name__, name)
    for module, name in ((chat, "stream_generate"), (benchmark, "stream_generate"),
                         (benchmark, "batch_generate"), (cache_prompt, "generate_step"),
                         (chat, "make_sampler")):
        assert getattr(module, name) is getattr(generate, name)
    for module in (chat, cache_prompt):
        assert module.make_prompt_cache is cache.make_prompt_cache
    assert cache_prompt.save_prompt_cache is cache.save_prompt_cache
    assert fuse.convert_to_gguf is gguf.convert_to_gguf
