"""Gear: Gemma 3's decoder (sandwich norms with ``1 + w``, QK-norm, scaled embeddings,
sliding layers with their own RoPE base) where some layers (``"conv_mixer"``) replace
attention by a gated key/value convolution (``ConvKVGatedMixer``, a ``StateCache``)."""

from dataclasses import dataclass
from typing import List, Optional

from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm, Scores
from ..layers.blocks import SandwichBlock
from ..layers.conv_attention import ConvKVGatedMixer
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d
from ..layers.stack import CausalLM
from .common import DecoderArgs, init_causal_lm, layer_type_rope, type_windows

LAYER_TYPES = ("full_attention", "sliding_attention", "conv_mixer")


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    layer_types: Optional[List[str]] = None
    hidden_activation: str = "gelu_pytorch_tanh"
    attention_bias: bool = False
    attention_dropout: float = 0.0  # training only: inference applies no dropout
    query_pre_attn_scalar: Optional[float] = None
    sliding_window: int = 512
    conv_L_cache: int = 3
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    tie_word_embeddings: bool = True
    final_logit_softcapping: Optional[float] = None
    attn_logit_softcapping: Optional[float] = None
    use_bidirectional_attention: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.query_pre_attn_scalar is None:
            self.query_pre_attn_scalar = self.head_dim
        if self.layer_types is None:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"gear: layer_types has {len(self.layer_types)} entries for "
                             f"{self.num_hidden_layers} layers")
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"gear: unknown layer types {unknown} (known: {LAYER_TYPES})")
        if self.use_bidirectional_attention:
            raise NotImplementedError("gear: use_bidirectional_attention is not supported "
                                      "(a causal language model only)")


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps, zero_centered=True)
        layers = []
        for kind in args.layer_types:
            mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_activation)
            if kind == "conv_mixer":
                mixer = ConvKVGatedMixer(args.hidden_size, args.num_attention_heads,
                                         args.num_key_value_heads, args.head_dim,
                                         args.conv_L_cache, args.attention_bias, norm)
                layers.append(SandwichBlock(mixer, mlp, norm, mixer_name="local_mixer"))
                continue
            attn = Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                             args.head_dim, layer_type_rope(args, kind), qk_norm=QKNorm(norm),
                             projections=Projections(bias=args.attention_bias),
                             scores=Scores(scale=args.query_pre_attn_scalar**-0.5,
                                           softcap=args.attn_logit_softcapping))
            layers.append(SandwichBlock(attn, mlp, norm))
        init_causal_lm(self, args, layers, norm(), embed_scale=args.hidden_size**0.5,
                       layer_windows=type_windows(args.layer_types, args.sliding_window))
        self.final_logit_softcap = args.final_logit_softcapping

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` (keys and values) per convolution layer; the attention
        layers' caches as ``CausalLM`` makes them."""
        kv = super().make_cache(max_kv_size)
        return [StateCache(2) if kind == "conv_mixer" else c
                for kind, c in zip(self.args.layer_types, kv)]

    def sanitize(self, weights):
        out = {}
        for name, w in super().sanitize(weights).items():
            if name.endswith("embed_scale"):  # a buffer, not a parameter
                continue
            if name.endswith(("key_conv.weight", "value_conv.weight")):
                w = CausalConv1d.sanitize_weight(w, self.args.conv_L_cache)
            out[name] = w
        return out
