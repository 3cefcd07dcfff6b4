"""Nemotron-NAS (NVIDIA's DeciLM-derived Llama-Nemotron "Super"/"Ultra"): Llama blocks
whose attention and MLP each differ per layer (``block_configs``): a regular
sublayer (attention with its own GQA group size ``n_heads_in_group``; an MLP of
width ``find_multiple(int(2 * ffn_mult * hidden / 3), 256)``), a single linear
layer in its place (``replace_with_linear``), or nothing (``no_op``, and then no
norm either).

Only layers with attention hold a key/value cache, as in mlx-lm (its
``make_cache`` skips the others): the stack hands caches and masks to those layers
in order."""

from dataclasses import dataclass, field

import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM, DecoderStack
from .common import config_rope, init_causal_lm
from .llama import ModelArgs as LlamaArgs


@dataclass
class ModelArgs(LlamaArgs):
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    tie_word_embeddings: bool = False
    block_configs: list = field(default_factory=list)
    # MLP widths are per layer (block_configs); the shared field is unused (mlx-lm has none).
    intermediate_size: int = 0

    def __post_init__(self):
        super().__post_init__()
        if len(self.block_configs) != self.num_hidden_layers:
            raise ValueError(f"nemotron-nas: {len(self.block_configs)} block_configs for "
                             f"{self.num_hidden_layers} layers")

    def sublayer(self, i, kind):
        """Layer ``i``'s ``"attention"`` or ``"ffn"`` config: ``"none"``,
        ``"linear"`` or the regular sublayer's config dict."""
        conf = self.block_configs[i].get(kind, {})
        if conf.get("no_op"):
            return "none"
        return "linear" if conf.get("replace_with_linear") else conf


def ffn_width(ffn_mult, hidden_size):
    """DeciLM's MLP width: ``int(2 * ffn_mult * hidden / 3)`` rounded up to 256."""
    n = int(2 * round(ffn_mult, 6) * hidden_size / 3)
    return -(-n // 256) * 256


class LinearReplacement(nn.Module):
    """One linear layer in place of an attention or MLP sublayer."""

    def __init__(self, dims, bias):
        super().__init__()
        self.linear = nn.Linear(dims, dims, bias=bias)

    def __call__(self, x, *_):
        return self.linear(x)


class NASBlock(nn.Module):
    """Llama's pre-norm block with either sublayer possibly absent (None)."""

    def __init__(self, attn, mlp, norm):
        super().__init__()
        self.self_attn, self.mlp = attn, mlp
        if attn is not None:
            self.input_layernorm = norm()
        if mlp is not None:
            self.post_attention_layernorm = norm()
        self.has_cache = isinstance(attn, Attention)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        if self.self_attn is not None:
            x = x + self.self_attn(self.input_layernorm(x), mask, offset, cache, attention)
        if self.mlp is not None:
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class AttentionLayersStack(DecoderStack):
    """The decoder stack where only attention layers take a cache and a mask."""

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        n = sum(layer.has_cache for layer in self.layers)
        caches, masks = iter(cache if cache is not None else [None] * n), iter(masks)
        for layer in self.layers:
            m, c = (next(masks), next(caches)) if layer.has_cache else (None, None)
            h = layer(h, m, offset, c, attention)
        return self.norm(h)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d = args.hidden_size
        rope = config_rope(args, args.head_dim)
        norm = lambda: RMSNorm(d, args.rms_norm_eps)

        def sublayer(i, kind):
            conf = args.sublayer(i, kind)
            if conf == "none":
                return None
            if conf == "linear":
                return LinearReplacement(d, args.attention_bias if kind == "attention"
                                         else args.mlp_bias)
            if kind == "attention":
                heads = args.num_attention_heads
                return Attention(d, heads, heads // conf["n_heads_in_group"], args.head_dim, rope,
                                 projections=Projections(bias=args.attention_bias))
            return MLP(d, ffn_width(conf["ffn_mult"], d), args.hidden_act, args.mlp_bias)

        layers = [NASBlock(sublayer(i, "attention"), sublayer(i, "ffn"), norm)
                  for i in range(args.num_hidden_layers)]
        init_causal_lm(self, args, layers, norm())
        self.model = AttentionLayersStack(args.vocab_size, d, layers, norm())
        # One window (global) per attention layer: the caches and masks there are.
        self.layer_windows = [None] * sum(layer.has_cache for layer in layers)
