"""Gemma 3n (text): Gemma 3's sliding/global layers around a stack of ``altup_num_inputs``
residual streams (AltUp: each layer predicts every stream from the others, runs on
one and corrects the rest), a low-rank LAuReL branch next to attention, per-layer
token embeddings mixed into each layer's output, gaussian top-k activation sparsity
in the first MLPs, and the last ``num_kv_shared_layers`` layers attending the keys
and values of the last earlier layer of their kind (models/kv_sharing.py: no cache
of their own; they use their source's keys, values and mask).
"""

import math
from dataclasses import dataclass
from functools import partial
from statistics import NormalDist
from typing import List, Optional, Union

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm, Scores
from ..layers.kv_sharing import (
    SharedKVAttention,
    drop_shared_kv_weights,
    kv_sources,
    layer_inputs,
)
from ..layers.mlp import MLP, activation
from ..layers.norms import RMSNorm, unit_rms_norm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .common import DecoderArgs, type_windows


@dataclass
class ModelArgs(DecoderArgs):
    intermediate_size: Union[int, List[int]]  # one per layer, or one for all
    vocab_size: int = 262_400
    num_key_value_heads: int = 2
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 32_768
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    attention_bias: bool = False
    sliding_window: int = 512
    layer_types: Optional[List[str]] = None
    final_logit_softcapping: Optional[float] = 30.0
    tie_word_embeddings: bool = True
    vocab_size_per_layer_input: int = 262_144
    hidden_size_per_layer_input: int = 256
    altup_active_idx: int = 0
    altup_correct_scale: bool = True
    altup_num_inputs: int = 4
    num_kv_shared_layers: int = 15
    laurel_rank: int = 64
    activation_sparsity_pattern: Optional[Union[float, List[float]]] = None  # or one for all

    def __post_init__(self):
        super().__post_init__()
        n = self.num_hidden_layers
        if not isinstance(self.intermediate_size, (list, tuple)):
            self.intermediate_size = [self.intermediate_size] * n
        if self.layer_types is None:  # transformers' default: every fifth layer global
            self.layer_types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                                for i in range(n)]
        sparsity = self.activation_sparsity_pattern
        if sparsity is None:
            sparse = 10 if n > 10 else 0
            sparsity = [0.95] * sparse + [0.0] * (n - sparse)
        elif not isinstance(sparsity, (list, tuple)):
            sparsity = [float(sparsity)] * n
        self.activation_sparsity_pattern = list(sparsity)
        for name in ("intermediate_size", "layer_types", "activation_sparsity_pattern"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"gemma3n: {name} has {len(getattr(self, name))} entries, "
                                 f"expected num_hidden_layers={n}")
        if any(not 0.0 <= s < 1.0 for s in self.activation_sparsity_pattern):
            raise ValueError("gemma3n: activation_sparsity_pattern values must be in [0, 1), "
                             f"got {self.activation_sparsity_pattern}")
        if not 0 <= self.altup_active_idx < self.altup_num_inputs:
            raise ValueError(f"gemma3n: altup_active_idx must be in [0, "
                             f"{self.altup_num_inputs - 1}], got {self.altup_active_idx}")
        # num_kv_shared_layers in range, and every KV-shared layer has a source.
        kv_sources(self.layer_types, self.num_kv_shared_layers)


def sparse_activation(act, sparsity):
    """``act`` after gaussian top-k: inputs below ``mean + std * z(sparsity)`` of
    each row (``z`` the standard normal quantile) are cut to zero."""
    if sparsity <= 0.0:
        return act
    return partial(gaussian_topk_activation, act=act, z=NormalDist().inv_cdf(sparsity))


def gaussian_topk_activation(x, act, z):
    """``act(max(x - (mean + std * z), 0))`` over the last axis (a module function,
    so the model copies and pickles)."""
    cutoff = mx.mean(x, axis=-1, keepdims=True) + mx.std(x, axis=-1, keepdims=True) * z
    return act(mx.maximum(x - cutoff, 0))


def rms_scaled_like(x, target):
    """``x`` rescaled to the root-mean-square ``target`` (mean square floored at 1e-5)."""
    return x * target / mx.sqrt(mx.maximum(mx.mean(x * x, axis=-1, keepdims=True), 1e-5))


class AltUp(nn.Module):
    """Alternating updates over the stacked streams ``(n, B, L, D)``: ``predict``
    mixes the streams before a layer, ``correct`` spreads the layer's update of the
    active stream to all of them."""

    def __init__(self, args):
        super().__init__()
        n, d = args.altup_num_inputs, args.hidden_size
        self.active = args.altup_active_idx
        self.router_scale = 1.0 / d
        self.correct_output_scale = mx.zeros((d,))
        self.correction_coefs = nn.Linear(n, n, bias=False)
        self.prediction_coefs = nn.Linear(n, n * n, bias=False)
        self.modality_router = nn.Linear(d, n, bias=False)
        self.router_norm = RMSNorm(d, args.rms_norm_eps)

    def modalities(self, x):
        routed = self.modality_router(self.router_norm(x) * self.router_scale)
        return mx.tanh(routed.astype(mx.float32)).astype(x.dtype)

    def predict(self, streams):
        m = self.modalities(streams[self.active])
        n = m.shape[-1]
        coefs = self.prediction_coefs(m).reshape(*m.shape[:-1], n, n).swapaxes(-1, -2)
        mixed = mx.matmul(streams.transpose(1, 2, 3, 0), coefs)  # (B, L, D, n)
        return (mixed.transpose(3, 0, 1, 2) + streams).astype(streams.dtype)

    def correct(self, predictions, activated):
        coefs = self.correction_coefs(self.modalities(activated)) + 1.0  # (B, L, n)
        innovation = activated - predictions[self.active]
        corrected = innovation[None] * coefs.transpose(2, 0, 1)[..., None] + predictions
        return corrected.astype(activated.dtype)


class Laurel(nn.Module):
    """Learned augmented residual: ``x + norm(right(left(x)))`` through a low rank."""

    def __init__(self, args):
        super().__init__()
        self.linear_left = nn.Linear(args.hidden_size, args.laurel_rank, bias=False)
        self.linear_right = nn.Linear(args.laurel_rank, args.hidden_size, bias=False)
        self.post_laurel_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, x):
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class DecoderLayer(nn.Module):
    def __init__(self, args, i, rope, shares_kv):
        super().__init__()
        d, eps = args.hidden_size, args.rms_norm_eps
        norm = lambda dims=d: RMSNorm(dims, eps)
        dims = (d, args.num_attention_heads, args.num_key_value_heads, args.head_dim, rope)
        common = dict(qk_norm=QKNorm(norm), scores=Scores(scale=1.0))
        if shares_kv:
            self.self_attn = SharedKVAttention(
                *dims, projections=Projections(bias=args.attention_bias), **common)
        else:
            self.self_attn = Attention(
                *dims, projections=Projections(bias=args.attention_bias,
                                               v_norm=partial(unit_rms_norm, eps=eps)),
                **common)
        act = activation(args.hidden_activation)
        self.mlp = MLP(d, args.intermediate_size[i],
                       sparse_activation(act, args.activation_sparsity_pattern[i]))
        for name in ("input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm",
                     "post_per_layer_input_norm"):
            setattr(self, name, norm())
        self.altup = AltUp(args)
        self.laurel = Laurel(args)
        self.per_layer_input_gate = nn.Linear(d, args.hidden_size_per_layer_input, bias=False)
        self.per_layer_projection = nn.Linear(args.hidden_size_per_layer_input, d, bias=False)
        self.act = act
        self.correct_scale = args.altup_correct_scale

    def __call__(self, streams, mask, offset, cache, per_layer_input, attention=None):
        """Streams ``(n, B, L, D)`` in and out."""
        predictions = self.altup.predict(streams)
        active = predictions[self.altup.active]
        normed = self.input_layernorm(active)
        laurel = self.laurel(normed)
        attn = self.self_attn(normed, mask, offset, cache, attention)
        h = (active + self.post_attention_layernorm(attn) + laurel) / math.sqrt(2)
        h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        corrected = self.altup.correct(predictions, h)
        first = corrected[self.altup.active]
        if self.correct_scale:
            first = first * self.altup.correct_output_scale
        first = self.act(self.per_layer_input_gate(first)) * per_layer_input
        first = self.post_per_layer_input_norm(self.per_layer_projection(first))
        return mx.concatenate([corrected[:1], corrected[1:] + first], axis=0)


class TextModel(nn.Module):
    """Hugging Face's ``Gemma3nTextModel`` (``model.*``): embeddings, per-layer
    inputs, the AltUp streams around the layers, and the final norm. ``sources``:
    per layer, the layer whose keys and values it attends (``kv_sources``)."""

    def __init__(self, args, layers, sources):
        super().__init__()
        d, n_layers, per = args.hidden_size, args.num_hidden_layers, args.hidden_size_per_layer_input
        self.embed_tokens = nn.Embedding(args.vocab_size, d)
        self.embed_tokens_per_layer = nn.Embedding(args.vocab_size_per_layer_input, n_layers * per)
        self.per_layer_model_projection = nn.Linear(d, n_layers * per, bias=False)
        self.per_layer_projection_norm = RMSNorm(per, args.rms_norm_eps)
        self.altup_projections = [nn.Linear(d, d, bias=False)
                                  for _ in range(args.altup_num_inputs - 1)]
        self.altup_unembed_projections = [nn.Linear(d, d, bias=False)
                                          for _ in range(args.altup_num_inputs - 1)]
        self.layers = layers
        self.norm = RMSNorm(d, args.rms_norm_eps)
        self.sources = sources
        self.args = args

    def per_layer_inputs(self, inputs, h):
        """``(B, L, layers, per)``: each layer's token embedding (ids past the per-layer
        vocabulary use id 0) mixed with a projection of the input embedding."""
        args = self.args
        shape = (*inputs.shape, args.num_hidden_layers, args.hidden_size_per_layer_input)
        ids = mx.where((inputs >= 0) & (inputs < args.vocab_size_per_layer_input), inputs, 0)
        own = self.embed_tokens_per_layer(ids) * args.hidden_size_per_layer_input**0.5
        proj = self.per_layer_model_projection(h) * args.hidden_size**-0.5
        proj = self.per_layer_projection_norm(proj.reshape(shape))
        return (proj + own.reshape(shape)) * 2**-0.5

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        if input_embeddings is None:
            h = h * self.args.hidden_size**0.5  # Python float: stays in the compute dtype
        per_layer = self.per_layer_inputs(inputs, h)
        target = mx.sqrt(mx.mean(h * h, axis=-1, keepdims=True))
        streams = mx.stack([h] + [rms_scaled_like(p(h), target) for p in self.altup_projections])
        inputs_per_layer = layer_inputs(self.sources, cache, masks)
        for i, (layer, (m, c)) in enumerate(zip(self.layers, inputs_per_layer)):
            streams = layer(streams, m, offset, c, per_layer[:, :, i], attention)
        target = mx.sqrt(mx.mean(streams[0] * streams[0], axis=-1, keepdims=True))
        outs = [streams[0]] + [rms_scaled_like(p(s), target)
                               for p, s in zip(self.altup_unembed_projections, streams[1:])]
        return self.norm(mx.mean(mx.stack(outs), axis=0))


class Model(CausalLM):
    """``layer_windows`` and the cache list cover the layers that own keys and values
    (all but the last ``num_kv_shared_layers``, as in mlx-lm); the others use their
    source's."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        global_rope = make_rope(args.head_dim, args.rope_theta, False, args.rope_scaling,
                                args.max_position_embeddings)
        local_rope = make_rope(args.head_dim, args.rope_local_base_freq)
        sources = kv_sources(args.layer_types, args.num_kv_shared_layers)
        layers = [DecoderLayer(args, i, global_rope if kind == "full_attention" else local_rope,
                               sources[i] != i)
                  for i, kind in enumerate(args.layer_types)]
        self.model = TextModel(args, layers, sources)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.final_logit_softcap = args.final_logit_softcapping
        owners = len(layers) - args.num_kv_shared_layers
        self.layer_windows = type_windows(args.layer_types[:owners], args.sliding_window)

    def sanitize(self, weights):
        """Drop the key/value weights hub checkpoints keep for KV-shared layers."""
        return drop_shared_kv_weights(super().sanitize(weights), self.model.sources)
