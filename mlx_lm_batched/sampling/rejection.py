"""Which drafted tokens a row keeps: the acceptance rules of speculative decoding.

A row proposes ``K`` draft tokens ``d_1..d_K``; the target model scores the row's last
token and the drafts in one call, giving ``K + 1`` next-token distributions ``p_0..p_K``.

- Greedy rows keep the drafts while each equals the target's argmax; the token after
  them is the target's argmax at the first mismatch (or after the last draft). The
  tokens are exactly those of plain greedy decoding.
- Sampled rows use rejection sampling (Leviathan et al., 2023; Chen et al., 2023): draft
  ``d_i`` drawn from ``q_i`` is kept with probability ``min(1, p_i(d_i) / q_i(d_i))``;
  at the first rejection the token is drawn from ``max(p_i - q_i, 0)`` renormalised,
  after ``K`` kept drafts from ``p_K``. Every token then follows the target's
  distribution ``p`` whatever the draft. A deterministic draft (prompt lookup) has
  ``q_i`` one-hot at ``d_i``.
"""

import mlx.core as mx


def leading_true(ok):
    """``(n, K)`` booleans -> ``(n,)`` count of leading True per row."""
    return mx.cumprod(ok.astype(mx.int32), axis=1).sum(axis=1)


def greedy_accept(target_logits, drafts):
    """``(n, K+1, V)`` target logits and ``(n, K)`` drafts -> ``(kept (n,), next (n,))``."""
    best = mx.argmax(target_logits, axis=-1)
    kept = leading_true(best[:, :-1] == drafts)
    return kept, mx.take_along_axis(best, kept[:, None], axis=1)[:, 0]


def one_hot(tokens, vocab, dtype=mx.float32):
    """``(...,)`` token ids -> ``(..., vocab)`` one-hot probabilities."""
    return (mx.arange(vocab) == tokens[..., None]).astype(dtype)


def rejection_accept(p, q, drafts, key=None):
    """Rejection sampling for one group of rows.

    ``p``: ``(n, K+1, V)`` target probabilities; ``q``: ``(n, K, V)`` draft probabilities
    the drafts were drawn from (None: deterministic drafts); ``drafts``: ``(n, K)``.
    ``key``: random key (None: the global random state). Returns ``(kept (n,), next (n,))``.
    """
    n, K = drafts.shape
    V = p.shape[-1]
    if q is None:
        q = one_hot(drafts, V, p.dtype)
    test_key, draw_key = (None, None) if key is None else mx.random.split(key)
    pd = mx.take_along_axis(p[:, :K], drafts[..., None], axis=-1)[..., 0]
    qd = mx.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
    u = mx.random.uniform(shape=(n, K), key=test_key)
    kept = leading_true(u * qd < pd)  # u < p/q without dividing by q
    q_next = mx.concatenate([q, mx.zeros((n, 1, V), q.dtype)], axis=1)
    at = kept[:, None, None]
    p_at = mx.take_along_axis(p, at, axis=1)[:, 0]
    residual = mx.maximum(p_at - mx.take_along_axis(q_next, at, axis=1)[:, 0], 0)
    total = residual.sum(axis=-1, keepdims=True)
    residual = mx.where(total > 0, residual / mx.maximum(total, 1e-30), p_at)
    token = mx.random.categorical(mx.log(residual), key=draw_key)
    return kept, token
