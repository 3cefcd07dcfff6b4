"""Cohere Command-R: one bias-free LayerNorm feeding attention and MLP in parallel,
interleaved RoPE, optional per-head QK LayerNorm, tied output scaled by
``logit_scale``."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import ParallelBlock
from ..layers.mlp import MLP
from ..layers.norms import HeadwiseLayerNorm, LayerNorm
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    # Sizes a config leaves out take mlx-lm's defaults (Command-R 35B's), so
    # ``ModelArgs(model_type="cohere")`` builds as it does there; RoPE keeps
    # transformers' default base, which is what a checkpoint that omits it means.
    model_type: str = "cohere"
    hidden_size: int = 8192
    num_hidden_layers: int = 40
    intermediate_size: Optional[int] = None  # 4 x hidden_size (DecoderArgs)
    num_attention_heads: int = 64
    vocab_size: int = 256000
    layer_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    logit_scale: float = 0.0625
    use_qk_norm: bool = False
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    layer_norm_bias: bool = False  # mlx-lm's field; Cohere's LayerNorms have no bias

    def __post_init__(self):
        super().__post_init__()
        require_values(self, layer_norm_bias=(False,))


class Model(CausalLM):
    def __init__(self, args: ModelArgs, windows=None):
        """``windows``: per layer, None for a global layer or the sliding window size;
        with windows given only windowed layers are rotated (Cohere 2's global
        layers use no position encoding)."""
        super().__init__()
        n_kv, head_dim = args.num_key_value_heads, args.head_dim
        rope = config_rope(args, head_dim, traditional=True)
        norm = lambda: LayerNorm(args.hidden_size, args.layer_norm_eps, bias=False)
        qk_norm = None
        if args.use_qk_norm:  # a (heads, head_dim) weight, fed the whole projection
            eps = args.layer_norm_eps
            qk_norm = QKNorm(lambda dims: HeadwiseLayerNorm(dims // head_dim, head_dim, eps),
                             full=True)
        layer_windows = windows or [None] * args.num_hidden_layers
        layers = [
            ParallelBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                          rope if windows is None or w is not None else None,
                          qk_norm=qk_norm,
                          projections=Projections(bias=args.attention_bias)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm, norm_names=("input_layernorm",),
            )
            for w in layer_windows
        ]
        init_causal_lm(self, args, layers, norm(), layer_windows)
        self.logit_scale = args.logit_scale
