import math

import mlx_lm_batched  # noqa: F401  (preloads BLAS before mlx.core)
import mlx.core as mx
import pytest

from mlx_lm_batched.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    categorical_sampling,
    make_logits_processors,
    make_sampler,
)

from mlx_lm import sample_utils as ref  # the oracle (test extra): missing fails, never skips

# Hand-checkable distribution: p = [0.5, 0.2, 0.15, 0.1, 0.05]
PROBS = [0.5, 0.2, 0.15, 0.1, 0.05]
LP = mx.log(mx.array(PROBS))


def allowed(x):
    """Per-row sets of token ids that survive filtering."""
    return [{i for i, v in enumerate(row) if v != -math.inf} for row in x.tolist()]


def random_logprobs(b, v, seed):
    key = mx.random.key(seed)
    return mx.log(mx.softmax(2.0 * mx.random.normal((b, v), key=key), axis=-1))


def tile(x, n):
    return mx.tile(x, (n, 1))


def counts(tokens, rows, vocab):
    """tokens come from a batch tiled n times: reshape to (n, rows) and count per row."""
    t = tokens.reshape(-1, rows)
    return [[(t[:, r] == v).sum().item() for v in range(vocab)] for r in range(rows)]


# --- per-row independence -----------------------------------------------------


def test_batched_draws_match_each_rows_softmax():
    mx.random.seed(0)
    lp = random_logprobs(3, 6, seed=1)
    temps = [1.0, 0.5, 2.0]
    n = 6000
    tokens = make_sampler(temp=temps * n)(tile(lp, n))
    assert tokens.shape == (3 * n,) and tokens.dtype == mx.uint32
    freq = counts(tokens, 3, 6)
    for r, t in enumerate(temps):
        expected = mx.softmax(lp[r] / t).tolist()
        for v in range(6):
            assert abs(freq[r][v] / n - expected[v]) < 0.025, (r, v)


def test_scalar_temp_matches_softmax():
    mx.random.seed(1)
    lp = random_logprobs(2, 5, seed=2)
    n = 6000
    freq = counts(make_sampler(temp=1.0)(tile(lp, n)), 2, 5)
    for r in range(2):
        expected = mx.softmax(lp[r]).tolist()
        assert all(abs(freq[r][v] / n - expected[v]) < 0.025 for v in range(5))


def test_hand_checked_masks():
    x = mx.stack([LP] * 4)
    assert allowed(apply_top_k(x, 2)) == [{0, 1}] * 4
    assert allowed(apply_top_k(x, [1, 2, 0, 3])) == [{0}, {0, 1}, set(range(5)), {0, 1, 2}]
    assert allowed(apply_top_p(x, [0.6, 0.75, 0.0, 1.0])) == [
        {0, 1}, {0, 1, 2}, set(range(5)), set(range(5))]
    assert allowed(apply_min_p(x, [0.25, 0.5, 0.0, 0.9])) == [
        {0, 1, 2}, {0}, set(range(5)), {0}]
    assert allowed(apply_min_p(x, 0.5, min_tokens_to_keep=3)) == [{0, 1, 2}] * 4


def test_sampler_draws_respect_per_row_filters():
    mx.random.seed(2)
    lp = mx.stack([LP] * 4)
    n = 3000
    s = make_sampler(temp=1.0, top_k=[2, 0, 0, 0] * n, top_p=[0, 0.75, 0, 0] * n,
                     min_p=[0, 0, 0.5, 0] * n)
    freq = counts(s(tile(lp, n)), 4, 5)
    seen = [{v for v in range(5) if freq[r][v] > 0} for r in range(4)]
    assert seen == [{0, 1}, {0, 1, 2}, {0}, set(range(5))]
    # Renormalised distribution inside the top-2 row: 0.5/0.7 vs 0.2/0.7.
    assert abs(freq[0][0] / n - 5 / 7) < 0.03


def test_greedy_rows_in_mixed_batch_are_argmax():
    mx.random.seed(3)
    lp = random_logprobs(6, 40, seed=4)
    temps = [0, 1.0, 0, 2.0, 0, 0.7]
    s = make_sampler(temp=temps, top_p=0.9, top_k=5, min_p=0.02,
                     xtc_probability=1.0, xtc_threshold=0.01)
    argmax = mx.argmax(lp, axis=-1).tolist()
    sampled_differs = False
    for _ in range(30):
        tok = s(lp).tolist()
        for r, t in enumerate(temps):
            if t == 0:
                assert tok[r] == argmax[r]
            else:
                sampled_differs |= tok[r] != argmax[r]
    assert sampled_differs  # XTC always removes the top token of sampling rows


def test_scalar_zero_temp_and_1d_input():
    lp = random_logprobs(3, 10, seed=5)
    assert make_sampler()(lp).tolist() == mx.argmax(lp, -1).tolist()
    out = make_sampler(temp=0.8, top_k=3)(lp[0])
    assert out.shape == () and out.dtype == mx.uint32
    assert make_sampler(temp=[0.0])(lp[1]).item() == mx.argmax(lp[1]).item()
    assert categorical_sampling(lp, [0, 0, 0]).tolist() == mx.argmax(lp, -1).tolist()


def test_seed_reproducible():
    lp = random_logprobs(8, 30, seed=6)
    s = make_sampler(temp=[1.0, 0.5] * 4, top_p=0.95, xtc_probability=0.5)
    mx.random.seed(42)
    a = s(lp).tolist()
    mx.random.seed(42)
    assert s(lp).tolist() == a


def test_per_row_length_mismatch_raises():
    s = make_sampler(temp=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="temp"):
        s(random_logprobs(2, 5, seed=0))


# --- mlx-lm oracle ------------------------------------------------------------


def ref_chain(row, top_p, min_p, min_keep, top_k):
    """mlx-lm's filter chain (its order: top_p, min_p, top_k) on one (1, V) row."""
    if 0 < top_p < 1:
        row = ref.apply_top_p(row, top_p)
    if min_p != 0:
        row = ref.apply_min_p(row, min_p, min_keep)
    if top_k > 0:
        row = ref.apply_top_k(row, top_k)
    return row


@pytest.mark.parametrize(
    "top_p,min_p,min_keep,top_k",
    [
        (0.9, 0.0, 1, 0),
        (0.0, 0.1, 1, 0),
        (0.0, 0.3, 4, 0),
        (0.0, 0.0, 1, 7),
        (0.8, 0.05, 2, 10),
        ([0.5, 0.9, 0.0, 0.99, 0.3, 1.0], [0.0, 0.1, 0.2, 0.0, 0.05, 0.01], 3, [0, 3, 12, 5, 0, 1]),
    ],
)
def test_allowed_sets_match_mlx_lm(top_p, min_p, min_keep, top_k):
    b, v = 6, 64
    lp = random_logprobs(b, v, seed=7)

    def per_row(p, r):
        return p[r] if isinstance(p, list) else p

    ours = apply_top_k(apply_min_p(apply_top_p(lp, top_p), min_p, min_keep), top_k)
    expected = [
        allowed(ref_chain(lp[r:r + 1], per_row(top_p, r), per_row(min_p, r), min_keep,
                          per_row(top_k, r)))[0]
        for r in range(b)
    ]
    assert allowed(ours) == expected

    # The sampler only ever draws from mlx-lm's allowed set.
    mx.random.seed(8)
    n = 300

    def rep(p):  # per-row parameters are tiled together with the batch
        return p * n if isinstance(p, list) else p

    s = make_sampler(temp=1.0, top_p=rep(top_p), min_p=rep(min_p),
                     min_tokens_to_keep=min_keep, top_k=rep(top_k))
    tok = s(tile(lp, n)).reshape(n, b).tolist()
    for r in range(b):
        assert {t[r] for t in tok} <= expected[r]


def test_xtc_matches_mlx_lm_when_always_applied():
    x = mx.stack([LP, LP])
    assert allowed(apply_xtc(x, 1.0, 0.12, [])) == [{2, 3, 4}] * 2
    assert allowed(apply_xtc(x, 1.0, 0.12, [0])) == [{0, 2, 3, 4}] * 2
    assert allowed(apply_xtc(x, 0.0, 0.12, [])) == [set(range(5))] * 2
    assert allowed(apply_xtc(x, 1.0, 0.12, [0])) == allowed(ref.apply_xtc(x, 1.0, 0.12, [0]))


# --- logits processors --------------------------------------------------------

HISTORY = [
    [-1, -1, -1, 3, 5, 3, 0],
    [1, 2, 2, 2, 9, 4, 4],
    [-1, -1, -1, -1, -1, -1, -1],
    [-1, 7, 7, 0, 1, 2, 8],
]


def apply_all(procs, tokens, logits):
    for p in procs:
        logits = p(tokens, logits)
    return logits


@pytest.mark.parametrize("ctx", [3, 20])
def test_processors_batch_equals_row_by_row(ctx):
    logits = 3.0 * mx.random.normal((4, 10), key=mx.random.key(9))
    kw = dict(logit_bias={4: 2.0, 0: -1.5}, repetition_penalty=1.3,
              repetition_context_size=ctx, presence_penalty=0.4, presence_context_size=ctx,
              frequency_penalty=0.25, frequency_context_size=ctx)
    out = apply_all(make_logits_processors(**kw), mx.array(HISTORY), logits)
    ref_procs = ref.make_logits_processors(**kw)
    for r, hist in enumerate(HISTORY):
        real = mx.array([t for t in hist if t >= 0], dtype=mx.int32)
        expected = apply_all(ref_procs, real, logits[r:r + 1])
        assert mx.allclose(out[r:r + 1], expected, atol=1e-5).item(), r
        # 1-D token input with (1, V) logits, like mlx-lm's single-sequence path.
        ours_1d = apply_all(make_logits_processors(**kw), real, logits[r:r + 1])
        assert ours_1d.shape == (1, 10)
        assert mx.allclose(ours_1d, expected, atol=1e-5).item()


def test_repetition_penalty_semantics_and_pads():
    logits = mx.array([[2.0, -2.0, 1.0, 4.0], [2.0, -2.0, 1.0, 4.0]])
    tokens = mx.array([[-1, -1, 0, 1, 1], [-1, -1, -1, -1, -1]])
    (proc,) = make_logits_processors(repetition_penalty=2.0)
    out = proc(tokens, logits).tolist()
    assert out[0] == [1.0, -4.0, 1.0, 4.0]  # penalised once despite duplicates
    assert out[1] == [2.0, -2.0, 1.0, 4.0]  # all-pad row untouched (no -1 -> id 0/V-1 leak)
    # uint32 histories (sampler output) with wrapped pads work too.
    assert proc(tokens.astype(mx.uint32), logits).tolist() == out


def test_per_row_penalty_and_logit_bias():
    logits = mx.zeros((2, 4)) + 1.0
    tokens = mx.array([[0, 1], [0, 1]])
    (rep,) = make_logits_processors(repetition_penalty=[2.0, 0.0])
    assert rep(tokens, logits).tolist() == [[0.5, 0.5, 1.0, 1.0], [1.0] * 4]
    (bias,) = make_logits_processors(logit_bias={2: 3.0})
    assert bias(tokens, logits).tolist() == [[1.0, 1.0, 4.0, 1.0]] * 2
    assert make_logits_processors() == []
    assert make_logits_processors(repetition_penalty=0.0) == []


# --- validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(temp=-0.1), "temp"),
        (dict(temp=float("nan")), "temp"),
        (dict(temp=[1.0, -1.0]), "temp"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=[0.5, -0.1]), "top_p"),
        (dict(min_p=1.1), "min_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=mx.array([1.0, 2.0])), "top_k"),
        (dict(min_tokens_to_keep=0), "min_tokens_to_keep"),
        (dict(xtc_probability=1.5), "xtc_probability"),
        (dict(xtc_threshold=0.6), "xtc_threshold"),
        (dict(xtc_special_tokens=[-3]), "xtc_special_tokens"),
    ],
)
def test_make_sampler_rejects_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=name) as e:
        make_sampler(temp=kwargs.pop("temp", 1.0), **kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(repetition_penalty=1.1, repetition_context_size=0), "repetition_context_size"),
        (dict(presence_penalty=float("inf")), "presence_penalty"),
        (dict(frequency_penalty="x"), "frequency_penalty"),
        (dict(logit_bias={"a": 1.0}), "logit_bias"),
        (dict(logit_bias={3: float("nan")}), "logit_bias"),
    ],
)
def test_make_logits_processors_rejects_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_logits_processors(**kwargs)


def test_filter_functions_validate():
    with pytest.raises(ValueError, match="top_k"):
        apply_top_k(LP, -2)
    with pytest.raises(ValueError, match="top_p"):
        apply_top_p(LP, 2.0)
    with pytest.raises(ValueError, match="min_tokens_to_keep"):
        apply_min_p(LP, 0.1, 0)
