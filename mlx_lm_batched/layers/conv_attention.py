"""Attention whose keys and values first pass through a short causal convolution over
time, one weight per key/value head and tap (Baichuan-M1): ``k'[t] = w0 * k[t-1] +
w1 * k[t]`` before RoPE. The convolution's state (each row's last raw key and value)
lives in a ``StateCache`` next to the layer's key/value cache, and padding columns are
zeroed and skipped exactly as in the state-space layers (``ssm.causal_conv``)."""

import mlx.core as mx

from .attention import Attention
from .ssm import base_cache, causal_conv, column_validity


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
