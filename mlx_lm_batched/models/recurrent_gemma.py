"""RecurrentGemma (Griffin): residual blocks whose temporal mixer is either an RG-LRU
recurrent block (conv + real-gated linear recurrence, ``StateCache``) or local
sliding-window attention with partial RoPE (``RotatingKVCache``); Gemma's ``1 + w``
norms, scaled embeddings and logit soft-capping."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.mlp import MLP, activation
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.ssm import (
    CausalConv1d,
    HybridBlock,
    base_cache,
    column_validity,
    rg_lru_scan,
)
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    lru_width: Optional[int] = None
    attention_window_size: int = 2048
    conv1d_width: int = 4
    logits_soft_cap: Optional[float] = 30.0
    rms_norm_eps: float = 1e-6
    hidden_activation: str = "gelu_pytorch_tanh"
    partial_rotary_factor: float = 0.5
    block_types: Optional[tuple] = None
    # The 9B checkpoints name the pattern ``_block_types`` (mlx-lm reads both names).
    _block_types: Optional[tuple] = None
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    embeddings_scale_by_sqrt_dim: bool = True  # mlx-lm's field; always so here

    def __post_init__(self):
        super().__post_init__()
        require_values(self, embeddings_scale_by_sqrt_dim=(True,))
        self.lru_width = self.lru_width or self.hidden_size
        if self.block_types is None:
            self.block_types = self._block_types or ("recurrent", "recurrent", "attention")
        types = list(self.block_types)
        self.layer_kinds = [types[i % len(types)] for i in range(self.num_hidden_layers)]


class RGLRU(nn.Module):
    """The real-gated linear recurrent unit: per-head block-diagonal input and
    recurrence gates, a learned decay ``recurrent_param``."""

    def __init__(self, width, heads):
        super().__init__()
        bw = width // heads
        self.heads = heads
        self.recurrent_param = mx.zeros((width,))
        self.input_gate_weight = mx.zeros((heads, bw, bw))
        self.input_gate_bias = mx.zeros((heads, bw))
        self.recurrent_gate_weight = mx.zeros((heads, bw, bw))
        self.recurrent_gate_bias = mx.zeros((heads, bw))

    def _gate(self, x, w, b):
        B, L, W = x.shape
        xh = x.reshape(B, L, self.heads, 1, -1)
        return mx.sigmoid((xh @ w)[..., 0, :] + b).reshape(B, L, W)

    def __call__(self, x, positions, state, valid):
        gate_x = self._gate(x, self.input_gate_weight, self.input_gate_bias)
        gate_a = self._gate(x, self.recurrent_gate_weight, self.recurrent_gate_bias)
        log_a = -8.0 * gate_a * nn.softplus(self.recurrent_param)
        return rg_lru_scan(x * gate_x, log_a, positions, state, valid)


class RecurrentBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        W = args.lru_width
        self.linear_y = nn.Linear(args.hidden_size, W)
        self.linear_x = nn.Linear(args.hidden_size, W)
        self.linear_out = nn.Linear(W, args.hidden_size)
        self.conv_1d = CausalConv1d(W, args.conv1d_width, bias=True)
        self.rg_lru = RGLRU(W, args.num_attention_heads)
        self.act = activation(args.hidden_activation)


    def __call__(self, x, mask, offset, cache=None, attention=None):
        L = x.shape[1]
        valid = column_validity(cache, offset, L)
        state = base_cache(cache)
        conv_state, lru_state = (None, None) if state is None else (state[0], state[1])
        y = self.act(self.linear_y(x))
        h, conv_state = self.conv_1d(self.linear_x(x), conv_state, valid)
        positions = offset[:, None] + mx.arange(L)[None, :]
        h, lru_state = self.rg_lru(h, positions, lru_state, valid)
        if state is not None:
            state[0], state[1] = conv_state, lru_state
            state.advance(L)
        return self.linear_out(h.astype(x.dtype) * y)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps, zero_centered=True)
        rope = make_rope(int(args.head_dim * args.partial_rotary_factor), args.rope_theta)
        names = ("temporal_block", "mlp_block", "temporal_pre_norm", "channel_pre_norm")
        layers = []
        for kind in args.layer_kinds:
            if kind == "recurrent":
                mixer = RecurrentBlock(args)
            else:
                mixer = Attention(args.hidden_size, args.num_attention_heads,
                                  args.num_key_value_heads, args.head_dim, rope,
                                  projections=Projections(bias=args.attention_bias, o_bias=True))
            mlp = MLP(args.hidden_size, args.intermediate_size // 2, args.hidden_activation,
                      bias=True)
            layers.append(HybridBlock(mixer, mlp, norm, names))
        windows = [args.attention_window_size if k == "attention" else None
                   for k in args.layer_kinds]
        # transformers rounds sqrt(hidden_size) to bfloat16 for this family.
        scale = mx.array(args.hidden_size ** 0.5, dtype=mx.bfloat16).item()
        init_causal_lm(self, args, layers, norm(), windows, embed_scale=float(scale))
        self.final_logit_softcap = args.logits_soft_cap

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per recurrent block, a ring of the window per attention one."""
        w = self.args.attention_window_size
        size = w if max_kv_size is None else min(w, max_kv_size)
        return [StateCache(2) if k == "recurrent" else RotatingKVCache(size)
                for k in self.args.layer_kinds]

    def sanitize(self, weights):
        out = {}
        for k, v in super().sanitize(weights).items():
            k = k.replace("model.final_norm.", "model.norm.")
            if k.endswith("conv_1d.weight"):
                v = CausalConv1d.sanitize_weight(v, self.args.conv1d_width)
            out[k] = v
        return out
