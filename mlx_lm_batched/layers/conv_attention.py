"""Attention whose keys and values first pass through a short causal convolution over
time, one weight per key/value head and tap (Baichuan-M1): ``k'[t] = w0 * k[t-1] +
w1 * k[t]`` before RoPE; and Gear's local mixer, which replaces the attention by a
sigmoid gate of the query on the convolved key (``ConvKVGatedMixer``). The
convolution's state (each row's last raw keys and values) lives in a ``StateCache``,
and padding columns are zeroed and skipped exactly as in the state-space layers
(``ssm.causal_conv``)."""

import mlx.core as mx

from .attention import Attention
from .attention_options import Projections, QKNorm
from .ssm import CausalConv1d, base_cache, causal_conv, column_validity


class ConvKVAttention(Attention):
    """The shared :class:`Attention` with Baichuan-M1's key/value convolution.

    ``conv_k``/``conv_v`` keep the checkpoint's ``(1, 1, kv_heads, 1, window)`` layout."""

    def __init__(self, *args, conv_window=2, **kwargs):
        super().__init__(*args, **kwargs)
        self.conv_window = conv_window
        self.conv_k = mx.zeros((1, 1, self.n_kv_heads, 1, conv_window))
        self.conv_v = mx.zeros((1, 1, self.n_kv_heads, 1, conv_window))

    def _channel_weight(self, conv):
        """``(kv_heads * head_dim, window)``: each head's taps repeated over its dims."""
        w = conv.reshape(self.n_kv_heads, 1, self.conv_window)
        return mx.broadcast_to(w, (self.n_kv_heads, self.head_dim, self.conv_window)).reshape(
            -1, self.conv_window)

    def __call__(self, x, mask, offset, cache=None, attention=None, conv_cache=None):
        """``cache``: the key/value cache; ``conv_cache``: the layer's ``StateCache``
        holding the last raw key and value of every row (None: no history)."""
        q, k, v = self.project(x)
        valid = column_validity(conv_cache, offset, x.shape[1])
        state = base_cache(conv_cache)
        k_state, v_state = (None, None) if state is None else (state[0], state[1])
        k, k_state = causal_conv(k, self._channel_weight(self.conv_k).astype(k.dtype), None,
                                 k_state, valid)
        v, v_state = causal_conv(v, self._channel_weight(self.conv_v).astype(v.dtype), None,
                                 v_state, valid)
        if state is not None:
            state[0], state[1] = k_state, v_state
            state.advance(x.shape[1])
        return self.attend_projections(q, k, v, mask, offset, cache, attention)


class ConvKVGatedMixer(Attention):
    """Gear's ``local_mixer``: ``o_proj(sigmoid(q * conv(k)) * conv(v))`` with each key
    and value head shared by its query heads, no softmax and no RoPE.

    Keys and values pass through depthwise causal convolutions (``key_conv``,
    ``value_conv``, Hugging Face's ``(C, 1, K)`` weights, one channel per key/value
    feature) after the per-head QK-norm. Its ``StateCache`` holds each row's last
    ``K - 1`` normed keys and values; padding columns are skipped as in ``causal_conv``.
    A subclass of :class:`Attention` for its projections, norms and head split (tensor
    parallelism: ``parallel.recurrent``)."""

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, kernel, bias, qk_norm):
        super().__init__(hidden_size, n_heads, n_kv_heads, head_dim, None,
                         qk_norm=QKNorm(qk_norm), projections=Projections(bias=bias))
        self.key_conv = CausalConv1d(n_kv_heads * head_dim, kernel, bias=bias)
        self.value_conv = CausalConv1d(n_kv_heads * head_dim, kernel, bias=bias)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        """``cache``: the layer's ``StateCache`` (None: no history); ``mask`` unused
        (the mixer only looks back ``K - 1`` real tokens of its own row)."""
        B, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        q, k, v = self.project(x)
        q = self.q_norm(q.reshape(B, L, self.n_heads, -1)).reshape(B, L, -1)
        k = self.k_norm(k.reshape(B, L, self.n_kv_heads, -1)).reshape(B, L, -1)
        k, k_state = self.key_conv(k, None if state is None else state[0], valid)
        v, v_state = self.value_conv(v, None if state is None else state[1], valid)
        if state is not None:
            state[0], state[1] = k_state, v_state
            state.advance(L)
        groups = self.n_heads // self.n_kv_heads
        shape = (B, L, self.n_kv_heads, groups, self.head_dim)
        k, v = (mx.broadcast_to(t.reshape(B, L, self.n_kv_heads, 1, -1), shape).reshape(B, L, -1)
                for t in (k, v))
        return self.o_proj(mx.sigmoid(q * k) * v)
