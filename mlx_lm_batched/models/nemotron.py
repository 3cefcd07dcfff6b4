"""Nemotron (3, 4, Minitron): llama blocks with LayerNorm1P (biased LayerNorm scaled
by ``1 + w``), an ungated squared-ReLU MLP and partial rotary."""

from dataclasses import dataclass

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import DenseMLP
from ..layers.norms import LayerNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    hidden_act: str = "relu2"
    norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    partial_rotary_factor: float = 0.5
    attention_bias: bool = False
    mlp_bias: bool = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, int(head_dim * args.partial_rotary_factor))
        norm = lambda: LayerNorm(args.hidden_size, args.norm_eps, zero_centered=True)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          projections=Projections(bias=args.attention_bias)),
                DenseMLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                         bias=args.mlp_bias),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())
