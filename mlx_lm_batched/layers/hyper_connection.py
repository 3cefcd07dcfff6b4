"""Manifold-constrained hyper-connections (DeepSeek V4.1): the residual stream is
``hc`` parallel streams; before each sub-block a learned mix collapses them to one
input, and after it the output is spread back over the streams while a doubly
stochastic matrix (Sinkhorn-normalised) mixes the streams among themselves.

Every formula here is per token, so a row's result never depends on the batch."""

import mlx.core as mx
import mlx.nn as nn


def sinkhorn(m, iters, eps):
    """Normalise the columns, then rows and columns ``iters - 1`` more times."""
    m = m / (mx.sum(m, axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        m = m / (mx.sum(m, axis=-1, keepdims=True) + eps)
        m = m / (mx.sum(m, axis=-2, keepdims=True) + eps)
    return m


class HyperConnection(nn.Module):
    """The mixing weights of one sub-block: ``fn`` (HF name), ``base`` and ``scale``
    (three factors: the pre, post and stream-mix columns), all float32."""

    def __init__(self, hc, hidden_size, sinkhorn_iters, hc_eps, norm_eps):
        super().__init__()
        self.hc = hc
        self.iters = sinkhorn_iters
        self.hc_eps = hc_eps
        self.norm_eps = norm_eps
        mix = (2 + hc) * hc
        self.fn = mx.zeros((mix, hc * hidden_size), dtype=mx.float32)
        self.base = mx.zeros((mix,), dtype=mx.float32)
        self.scale = mx.ones((3,), dtype=mx.float32)

    def __call__(self, streams):
        """``streams`` ``(B, L, hc, D)`` -> ``(pre (B, L, hc), post (B, L, hc),
        comb (B, L, hc, hc))``, computed in float32 as the reference does."""
        hc = self.hc
        flat = streams.reshape(*streams.shape[:2], -1).astype(mx.float32)
        flat = mx.fast.rms_norm(flat, None, self.norm_eps)
        # One scale per column group: pre (hc), post (hc), stream mix (hc * hc).
        factors = mx.concatenate([mx.repeat(self.scale[:2], hc), mx.repeat(self.scale[2:], hc * hc)])
        mix = (flat @ self.fn.T) * factors + self.base
        pre, post, comb = mx.split(mix, [hc, 2 * hc], axis=-1)
        comb = mx.softmax(comb.reshape(*comb.shape[:-1], hc, hc), axis=-1) + self.hc_eps
        eps = mx.array(self.hc_eps, dtype=mx.float32)
        return (mx.sigmoid(pre) + self.hc_eps, 2.0 * mx.sigmoid(post),
                sinkhorn(comb, self.iters, eps))


def collapse(streams, weights):
    """The sub-block input: the streams summed with ``weights`` ``(B, L, hc)``."""
    out = mx.sum(weights[..., None] * streams.astype(mx.float32), axis=2)
    return out.astype(streams.dtype)


def expand(out, streams, post, comb):
    """The new streams: ``post``-weighted copies of the sub-block output plus the old
    streams mixed by ``comb`` (``comb[i, j]`` sends stream ``i`` into stream ``j``)."""
    mixed = mx.sum(comb[..., None] * streams[..., :, None, :], axis=2)
    return (post[..., None] * out[..., None, :] + mixed).astype(streams.dtype)
