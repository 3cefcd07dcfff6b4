"""Baichuan-M1: llama-like pre-norm blocks whose attention runs a width-2 causal
convolution over the keys and values (``layers.conv_attention``), with sliding-window
layers (``sliding_window_layers``, which may have their own head counts) and a
normalised LM head (each vocabulary row scaled to unit norm, Baichuan's ``NormHead``).

Each layer holds two caches: ``cache[2i]`` (key/value; a ring of ``sliding_window``
slots on windowed layers) and ``cache[2i + 1]`` (``StateCache``: the convolution's last
raw key and value)."""

from dataclasses import dataclass, field
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers import masks as masks_lib
from ..layers.attention_options import Projections
from ..layers.conv_attention import ConvKVAttention
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.step import resolve_offset
from .common import DecoderArgs, config_rope


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    sliding_window: Optional[int] = None
    sliding_window_layers: List[int] = field(default_factory=list)
    conv_window: int = 2
    num_swa_attention_heads: Optional[int] = None
    num_swa_key_value_heads: Optional[int] = None
    tie_word_embeddings: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.conv_window != 2:
            raise ValueError(f"Baichuan-M1 conv_window={self.conv_window} is not supported "
                             "(its reference code and checkpoints use 2)")
        if self.sliding_window_layers and not self.sliding_window:
            raise ValueError("Baichuan-M1 config has sliding_window_layers but no sliding_window")


class DecoderLayer(nn.Module):
    def __init__(self, args, windowed):
        super().__init__()
        heads = (args.num_swa_attention_heads if windowed and args.num_swa_attention_heads
                 else args.num_attention_heads)
        kv_heads = (args.num_swa_key_value_heads if windowed and args.num_swa_key_value_heads
                    else args.num_key_value_heads)
        head_dim = args.hidden_size // heads
        self.self_attn = ConvKVAttention(args.hidden_size, heads, kv_heads, head_dim,
                                         config_rope(args, head_dim), conv_window=args.conv_window,
                                         projections=Projections(fused_qkv=True, qkv_name="W_pack"))
        self.mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, x, mask, offset, kv_cache, conv_cache, attention=None):
        h = x + self.self_attn(self.input_layernorm(x), mask, offset, kv_cache, attention,
                               conv_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        windowed = set(args.sliding_window_layers)
        self.layer_windows = [args.sliding_window if i in windowed else None
                              for i in range(args.num_hidden_layers)]
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.model.layers = [DecoderLayer(args, w is not None) for w in self.layer_windows]
        self.model.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 attention=None):
        """Logits ``(B, L, vocab)``; ``mask``: one array, a list per layer, or None to
        build each layer's (global or windowed) mask from ``offset`` and the caches."""
        offset = resolve_offset(inputs, offset, cache)
        n = len(self.layers)
        if isinstance(mask, (list, tuple)):
            masks = list(mask)
        elif mask is not None:
            masks = [mask] * n
        else:
            kv = None if cache is None else cache[0::2]
            masks = masks_lib.masks_for_layers(kv, self.layer_windows, inputs.shape[1], offset)
        h = self.model.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        extra = () if attention is None else (attention,)
        for i, layer in enumerate(self.layers):
            kv, conv = (None, None) if cache is None else (cache[2 * i], cache[2 * i + 1])
            h = layer(h, masks[i], offset, kv, conv, *extra)
        h = self.model.norm(h)
        return self.lm_head(h) if "lm_head" in self else self.model.embed_tokens.as_linear(h)

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self, max_kv_size=None):
        """Per layer: a key/value cache (a ring on windowed layers or with
        ``max_kv_size``), then the convolution's ``StateCache``."""
        caches = []
        for window in self.layer_windows:
            bounds = [b for b in (window, max_kv_size) if b is not None]
            caches.append(RotatingKVCache(min(bounds)) if bounds else KVCache())
            caches.append(StateCache(2))
        return caches

    def sanitize(self, weights):
        """Drop RoPE buffers; scale each LM-head row to unit norm (``NormHead``: the
        reference normalises at run time; doing it once here gives the same logits, and
        an already normalised head, as our own or mlx-lm's conversions save, is kept
        bit for bit). Quantized heads were normalised before quantization."""
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        head = weights.get("lm_head.weight")
        if head is not None and "lm_head.scales" not in weights:
            w = head.astype(mx.float32)
            norms = mx.linalg.norm(w, axis=-1, keepdims=True)
            if mx.abs(norms - 1).max().item() > 1e-3:
                weights["lm_head.weight"] = (w / (norms + 1e-7)).astype(head.dtype)
        if self.args.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return weights
