"""StarCoder 2: pre-norm blocks with biased LayerNorms, biased attention, a plain
(ungated) ``c_fc``/``c_proj`` MLP, and one sliding window for every layer."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import DenseMLP
from ..layers.norms import LayerNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    intermediate_size: Optional[int] = None  # 4 x hidden_size (DecoderArgs)
    vocab_size: int = 49152  # mlx-lm's default (StarCoder2's vocabulary)
    norm_epsilon: float = 1e-5
    hidden_act: str = "gelu_pytorch_tanh"
    use_bias: bool = True
    sliding_window: Optional[int] = None
    tie_word_embeddings: bool = True


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda: LayerNorm(args.hidden_size, args.norm_epsilon)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          projections=Projections(bias=args.use_bias)),
                DenseMLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                         args.use_bias, names=("c_fc", "c_proj")),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(),
                       [args.sliding_window] * args.num_hidden_layers)
