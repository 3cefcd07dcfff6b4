"""talkie: pre-norm blocks with weightless RMS norms whose residual branches are
scaled by learned gains (``attn_gain``, ``mlp_gain``), plus a learned share of the
normed embeddings added back after every block (``embed_skip``); attention rotates
by the negated angle, RMS-norms the rotated queries and keys (no weight) and scales
each query head by ``head_g``; the head is a bare matrix times a learned gain.

mlx-lm's names (``model.blocks.{i}.attn.attn_query``, ``attn_gain.a_g`` ...) are
mapped to the shared layers' in ``sanitize``."""

import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import QKNorm
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import negated_rope
from ..layers.stack import CausalLM, DecoderStack
from .args import BaseModelArgs

_RENAMES = [
    (r"^model\.embed\.", "model.embed_tokens."),
    (r"^model\.blocks\.(\d+)\.attn\.attn_(query|key|value)\.",
     lambda m: f"model.layers.{m[1]}.self_attn.{m[2][0]}_proj."),
    (r"^model\.blocks\.(\d+)\.attn\.attn_resid\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^model\.blocks\.(\d+)\.attn\.head_gain\.head_g$", r"model.layers.\1.self_attn.head_g"),
    (r"^model\.blocks\.(\d+)\.mlp\.mlp_gate\.", r"model.layers.\1.mlp.gate_proj."),
    (r"^model\.blocks\.(\d+)\.mlp\.mlp_linear\.", r"model.layers.\1.mlp.up_proj."),
    (r"^model\.blocks\.(\d+)\.mlp\.mlp_resid\.", r"model.layers.\1.mlp.down_proj."),
    (r"^model\.blocks\.(\d+)\.(attn_gain|mlp_gain|embed_skip)\.a_g$", r"model.layers.\1.\2"),
    (r"^lm_head$", "lm_head.weight"),
    (r"^lm_head_gain\.w_g$", "lm_head.gain"),
]


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str = "talkie"
    hidden_size: int = 5120
    num_hidden_layers: int = 40
    num_attention_heads: int = 40
    head_dim: int = 128
    intermediate_size: int = 13696
    vocab_size: int = 65540
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1.1920928955078125e-07


class HeadGainAttention(Attention):
    """Attention whose normed, rotated query heads are scaled by ``head_g``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.head_g = mx.ones((self.n_heads,))

    def _heads(self, t, which, offset):
        t = super()._heads(t, which, offset)
        return t * self.head_g.astype(t.dtype)[:, None, None] if which == 0 else t


class GainBlock(nn.Module):
    """``x += attn_gain * attn(norm(x)); x += mlp_gain * mlp(norm(x));
    x += embed_skip * embeddings``."""

    def __init__(self, attn, mlp, norm):
        super().__init__()
        self.self_attn, self.mlp, self.norm = attn, mlp, norm
        self.attn_gain = mx.ones((1,))
        self.mlp_gain = mx.ones((1,))
        self.embed_skip = mx.zeros((1,))

    def __call__(self, x, mask, offset, cache=None, attention=None, embeddings=None):
        x = x + self.attn_gain.astype(x.dtype) * self.self_attn(self.norm(x), mask, offset,
                                                                  cache, attention)
        x = x + self.mlp_gain.astype(x.dtype) * self.mlp(self.norm(x))
        return x + self.embed_skip.astype(x.dtype) * embeddings


class EmbedSkipStack(DecoderStack):
    """The stack of :class:`GainBlock`: the normed embeddings enter the first block
    and are handed to every block."""

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.norm(self.embed(inputs, offset, input_embeddings))
        e = h
        cache = cache if cache is not None else [None] * len(self.layers)
        for layer, m, c in zip(self.layers, masks, cache):
            h = layer(h, m, offset, c, attention, embeddings=e)
        return self.norm(h)


class GainHead(nn.Linear):
    """The output head times its learned scalar ``gain``."""

    def __init__(self, dims, vocab_size):
        super().__init__(dims, vocab_size, bias=False)
        self.gain = mx.ones((1,))

    def __call__(self, x):
        return super().__call__(x) * self.gain.astype(x.dtype)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args, self.model_type = args, args.model_type
        d, hd = args.hidden_size, args.head_dim
        rope = negated_rope(hd, args.rope_theta)
        norm = lambda dims=d: RMSNorm(dims, args.rms_norm_eps, affine=False)
        layers = [
            GainBlock(HeadGainAttention(d, args.num_attention_heads, args.num_attention_heads, hd,
                                        rope, qk_norm=QKNorm(norm, after_rope=True)),
                      MLP(d, args.intermediate_size), norm())
            for _ in range(args.num_hidden_layers)
        ]
        self.model = EmbedSkipStack(args.vocab_size, d, layers, norm())
        self.lm_head = GainHead(d, args.vocab_size)
        self.layer_windows = [None] * args.num_hidden_layers

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            if "rotary" in k or k.endswith(("cos", "sin")):
                continue
            for pattern, repl in _RENAMES:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            out[k] = v
        return super().sanitize(out)
