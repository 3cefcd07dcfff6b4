"""Bailing MoE Linear (inclusionAI's Ling-linear / Ring-linear): Bailing MoE's blocks
with most softmax-attention layers replaced by a decayed linear attention (lightning
attention, ``StateCache``); every ``layer_group_size``-th layer, and the layers past
the last whole group, keep softmax attention (``KVCache``).

The linear layers project q, k, v with the fused ``query_key_value``, apply the same
QK-norm and partial RoPE as the softmax layers, decay their state per head by
``exp(-slope)`` (ALiBi-like slopes scaled down with depth), norm the output in groups
and gate it by ``sigmoid(g_proj(x))``."""

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.lightning import lightning_attention
from ..layers.ssm import GatedRMSNorm, base_cache, column_validity
from . import bailing_moe
from .common import config_rope
from .args import require_values


@dataclass
class ModelArgs(bailing_moe.ModelArgs):
    layer_group_size: int = 1
    group_norm_size: int = 1
    use_rmsnorm: bool = True  # mlx-lm's field; LayerNorm (False) is not implemented

    def __post_init__(self):
        super().__post_init__()
        require_values(self, use_rmsnorm=(True,))

    def is_softmax_layer(self, i):
        """Every ``layer_group_size``-th layer and those past the last whole group."""
        g, n = self.layer_group_size, self.num_hidden_layers
        return (i + 1) % g == 0 or i >= n // g * g


def linear_slopes(n_heads, depth, n_layers):
    """Per-head decay rates ``(H,)`` (positive): ALiBi's slopes (interleaved for a head
    count that is not a power of two) times ``1 - depth / (n_layers - 1)`` (``depth``:
    the layer's index, or one less for Ling-linear)."""
    def power_of_2(n):
        return [2 ** (-(2 ** -(math.log2(n) - 3)) * (i + 1)) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_2(n_heads)
    else:
        p = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_2(p) + power_of_2(2 * p)[::2][: n_heads - p]
    factor = 1 - depth / max(1, n_layers - 1) + 1e-5
    return mx.array(slopes, mx.float32) * factor


class LinearAttention(Attention):
    """The shared attention's projections, QK-norm and RoPE feeding lightning attention
    (every head its own key/value head); its ``StateCache`` holds ``[state]``."""

    def __init__(self, args, head_dim, slopes, rope, qk_norm):
        heads = args.num_attention_heads
        super().__init__(args.hidden_size, heads, heads, head_dim, rope, qk_norm=qk_norm,
                         projections=Projections(bias=args.use_qkv_bias, o_bias=args.use_bias,
                                                 fused_qkv=True))
        self.g_proj = nn.Linear(args.hidden_size, heads * head_dim, bias=False)
        self.g_norm = GatedRMSNorm(heads * head_dim, args.group_norm_size, args.rms_norm_eps,
                                   norm_before_gate=True, gate_act="sigmoid")
        self._slope = slopes  # (H,) decay rates: not a parameter

    def __call__(self, x, mask, offset, cache=None, attention=None):
        B, L, _ = x.shape
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        q, k, v = self.project(x)
        q = self._heads(q, 0, offset) * self.scale
        k = self._heads(k, 1, offset)
        v = v.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        out, new_state = lightning_attention(q, k, v, self._slope,
                                             None if state is None else state[0], valid)
        if state is not None:
            state[0] = new_state
            state.advance(L)
        out = out.transpose(0, 2, 1, 3).reshape(B, L, -1).astype(x.dtype)
        return self.o_proj(self.g_norm(out, self.g_proj(x)))


class Model(bailing_moe.Model):
    def mixer(self, args, i, norm):
        if args.is_softmax_layer(i):
            return super().mixer(args, i, norm)
        return self.linear_mixer(args, i, norm, args.hidden_size // args.num_attention_heads,
                                 max(0, i - 1))

    def linear_mixer(self, args, i, norm, head_dim, depth):
        """Layer ``i``'s lightning attention over heads of ``head_dim``, decayed for
        ``depth`` (see ``linear_slopes``)."""
        rope = config_rope(args, int(head_dim * args.partial_rotary_factor))
        slopes = linear_slopes(args.num_attention_heads, depth, args.num_hidden_layers)
        return LinearAttention(args, head_dim, slopes, rope, self.qk_norm(args, norm))

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per linear layer, the shared key/value caches for the others."""
        caches = super().make_cache(max_kv_size)
        return [c if self.args.is_softmax_layer(i) else StateCache(1)
                for i, c in enumerate(caches)]
