"""mlx-lm 0.32's numeric module-level functions and classes that code written for mlx-lm
imports (``models.ssm``, ``models.gated_delta``, ``models.rope_utils``,
``models.activations``, ``models.switch_layers``), called with the same arguments as
mlx-lm's own and compared with their results. mlx-lm is the oracle (its CPU ops path);
the package never imports it. The smaller names are in ``test_mlx_lm_contract_helpers.py``."""

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
    ("ProportionalRoPE", dict(dims=16, rotated_dims=5, base=1e6)),  # ceil(5/2) rotated
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
    if name == "ProportionalRoPE":  # the same frequencies, bit for bit
        assert mx.array_equal(ours._freqs, theirs._freqs)
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


def test_multi_linear_matches_mlx_lm():
    """mlx-lm's per-head linear maps (``models.mla``), float and quantized, both call
    forms, on the same weights."""
    import mlx.nn as nn
    import mlx_lm.models.mla as lm_mla

    from mlx_lm_batched.models import mla
    theirs, ours = lm_mla.MultiLinear(64, 32, 4), mla.MultiLinear(64, 32, 4)
    assert ours.weight.shape == theirs.weight.shape == (4, 32, 64)
    ours.weight = theirs.weight
    x = mx.random.normal((2, 4, 3, 64), key=mx.random.key(11))
    y = mx.random.normal((2, 4, 3, 32), key=mx.random.key(12))
    close(theirs(x), ours(x), atol=1e-5, rtol=1e-5)
    close(theirs(y, transpose=False), ours(y, transpose=False), atol=1e-5, rtol=1e-5)
    for mode, bits, group in (("affine", 4, 32), ("mxfp4", 4, 32)):
        tq, oq = theirs.to_quantized(group, bits, mode), ours.to_quantized(group, bits, mode)
        assert isinstance(oq, mla.QuantizedMultiLinear) and oq.mode == mode
        for name in ("weight", "scales"):
            assert np.array_equal(np.array(tq[name]), np.array(oq[name]))
        close(tq(x), oq(x), atol=1e-5, rtol=1e-5)
        close(tq(y, transpose=False), oq(y, transpose=False), atol=1e-5, rtol=1e-5)
        assert not oq.trainable_parameters()
    holder = nn.Module()
    holder.embed_q = mla.MultiLinear(64, 32, 4)
    nn.quantize(holder, group_size=32, bits=4)  # nn.quantize finds to_quantized
    assert isinstance(holder.embed_q, mla.QuantizedMultiLinear)
