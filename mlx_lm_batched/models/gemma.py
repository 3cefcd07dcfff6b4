"""Gemma: llama blocks with zero-centered RMS norms (``1 + w``), embeddings scaled by
``sqrt(hidden_size)``, tanh-approximated GELU gating and a tied output layer."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


def gemma_activation(hidden_activation, hidden_act):
    # Gemma checkpoints say "gelu" but were trained with the tanh approximation;
    # transformers maps it the same way.
    act = hidden_activation or hidden_act or "gelu_pytorch_tanh"
    return "gelu_pytorch_tanh" if act == "gelu" else act


@dataclass
class ModelArgs(DecoderArgs):
    vocab_size: int = 256000
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    hidden_act: Optional[str] = None
    hidden_activation: Optional[str] = None
    attention_bias: bool = False
    tie_word_embeddings: bool = True


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps, zero_centered=True)
        act = gemma_activation(args.hidden_activation, args.hidden_act)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          projections=Projections(bias=args.attention_bias)),
                MLP(args.hidden_size, args.intermediate_size, act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), embed_scale=args.hidden_size**0.5)
