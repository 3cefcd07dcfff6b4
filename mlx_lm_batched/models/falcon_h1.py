"""Falcon-H1: every layer runs attention and a Mamba-2 mixer in parallel on the same
normed input (their outputs summed into the residual), then a SwiGLU MLP; many MuP
multipliers. Each layer holds two caches: ``cache[2i]`` (key/value) and
``cache[2i + 1]`` (``StateCache``)."""

from dataclasses import dataclass, field
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers import masks as masks_lib
from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.mlp import activation
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d
from ..layers.step import resolve_offset
from .args import require_values
from .common import DecoderArgs, config_rope
from .mamba2 import Mamba2Mixer, SSDDims, SSDOutput


@dataclass
class ModelArgs(DecoderArgs):
    # Sizes a config leaves out take mlx-lm's defaults, so ``ModelArgs(model_type=
    # "falcon_h1", ...)`` with few fields builds as it does there; the multipliers and
    # Mamba sizes keep transformers' defaults (what a checkpoint that omits them means).
    model_type: str = "falcon_h1"
    hidden_size: int = 1024
    num_hidden_layers: int = 36
    num_attention_heads: int = 8
    vocab_size: int = 32784
    intermediate_size: Optional[int] = None  # 4 x hidden_size (DecoderArgs)
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    mlp_bias: bool = False
    projectors_bias: bool = False
    mamba_d_ssm: Optional[int] = 1024  # transformers' default; None: expand x hidden_size
    mamba_n_heads: int = 128
    mamba_d_head: int = 8
    mamba_n_groups: int = 1
    mamba_d_state: int = 256
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_norm_before_gate: bool = True
    mamba_rms_norm: bool = False
    time_step_limit: Optional[list] = None
    lm_head_multiplier: float = 1.0
    embedding_multiplier: float = 1.0
    mlp_multipliers: List[float] = field(default_factory=lambda: [1.0, 1.0])
    key_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    ssm_multipliers: List[float] = field(default_factory=lambda: [1.0] * 5)
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0
    # mlx-lm's fields: initialisation and the scan's chunk length change no result here,
    # mlx-lm does not read ``mlp_expansion_factor``, and every block has its MLP.
    initializer_range: float = 0.02
    mamba_chunk_size: int = 128
    mamba_use_mlp: bool = True
    mlp_expansion_factor: int = 8

    def __post_init__(self):
        super().__post_init__()
        require_values(self, mamba_use_mlp=(True,))
        self.mamba_d_ssm = self.mamba_d_ssm or int(self.mamba_expand * self.hidden_size)

    def mup_vector(self):
        """Per-channel multipliers of the Mamba input projection (gate, x, B, C, dt)."""
        D, GN, H = self.mamba_d_ssm, self.mamba_n_groups * self.mamba_d_state, self.mamba_n_heads
        m = self.ssm_multipliers
        return mx.concatenate([mx.full((n,), float(v)) for n, v in
                               zip((D, D, GN, GN, H), m)])


class MLP(nn.Module):
    def __init__(self, args):
        super().__init__()
        h, i, b = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=b), nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)
        self.act = activation(args.hidden_act)
        self.gate_mult, self.down_mult = (float(v) for v in args.mlp_multipliers)


    def __call__(self, x):
        y = self.up_proj(x) * self.act(self.gate_proj(x) * self.gate_mult)
        return self.down_proj(y) * self.down_mult


class KeyScaledAttention(Attention):
    """The shared attention with Falcon-H1's ``key_multiplier`` on the key projection
    (a plain ``k_proj``, so tensor parallelism splits it like any other)."""

    def __init__(self, *args, key_multiplier=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_multiplier = key_multiplier

    def project(self, x):
        q, k, v = super().project(x)
        return q, k * self.key_multiplier, v


class DecoderLayer(nn.Module):
    def __init__(self, args, rope):
        super().__init__()
        a = args
        self.self_attn = KeyScaledAttention(a.hidden_size, a.num_attention_heads,
                                            a.num_key_value_heads, a.head_dim, rope,
                                            key_multiplier=a.key_multiplier,
                                            projections=Projections(bias=a.attention_bias))
        dims = SSDDims(a.mamba_n_heads, a.mamba_d_head, a.mamba_d_state, a.mamba_n_groups,
                       a.mamba_d_conv)
        output = SSDOutput(rms_norm=a.mamba_rms_norm, norm_before_gate=a.mamba_norm_before_gate,
                           bias=a.projectors_bias)
        self.mamba = Mamba2Mixer(a.hidden_size, dims, a.rms_norm_eps, a.mamba_proj_bias,
                                 a.mamba_conv_bias, a.time_step_limit, output, a.mup_vector())
        self.feed_forward = MLP(args)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mults = (a.ssm_in_multiplier, a.ssm_out_multiplier, a.attention_in_multiplier,
                      a.attention_out_multiplier)

    def __call__(self, x, mask, offset, kv_cache, state_cache):
        ssm_in, ssm_out, attn_in, attn_out = self.mults
        h = self.input_layernorm(x)
        m = self.mamba(h * ssm_in, None, offset, state_cache) * ssm_out
        a = self.self_attn(h * attn_in, mask, offset, kv_cache) * attn_out
        x = x + m + a
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        rope = config_rope(args, args.head_dim)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.model.layers = [DecoderLayer(args, rope) for _ in range(args.num_hidden_layers)]
        self.model.final_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 **unused):
        offset = resolve_offset(inputs, offset, cache)
        if mask is None:  # every attention layer's cache has one layout
            mask = masks_lib.masks_for_layers(None if cache is None else [cache[0]], [None],
                                              inputs.shape[1], offset)[0]
        elif isinstance(mask, (list, tuple)):
            mask = mask[0]
        h = self.model.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        h = h * self.args.embedding_multiplier
        for i, layer in enumerate(self.layers):
            kv, state = (None, None) if cache is None else (cache[2 * i], cache[2 * i + 1])
            h = layer(h, mask, offset, kv, state)
        h = self.model.final_layernorm(h)
        out = self.lm_head(h) if "lm_head" in self else self.model.embed_tokens.as_linear(h)
        return out * self.args.lm_head_multiplier

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self, max_kv_size=None):
        """Per layer: a key/value cache, then a ``StateCache``."""
        caches = []
        for _ in self.layers:
            caches.append(KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size))
            caches.append(StateCache(2))
        return caches

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            if "rotary_emb.inv_freq" in k or k.endswith("mup_vector"):
                continue
            # Conversions by earlier versions wrapped k_proj (``k_proj.linear.``).
            k = k.replace("self_attn.k_proj.linear.", "self_attn.k_proj.")
            if k.endswith("conv1d.weight"):
                v = CausalConv1d.sanitize_weight(v, self.args.mamba_d_conv)
            out[k] = v
        if self.args.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        return out
