"""StarCoder 2: pre-norm blocks with biased LayerNorms, biased attention, a plain
(ungated) ``c_fc``/``c_proj`` MLP, and one sliding window for every layer."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import Attention, CausalLM, DecoderStack, DenseMLP, LayerNorm, PreNormBlock
from .rope import make_rope


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    norm_epsilon: float = 1e-5
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    hidden_act: str = "gelu_pytorch_tanh"
    use_bias: bool = True
    sliding_window: Optional[int] = None
    tie_word_embeddings: bool = True


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        rope = make_rope(head_dim, args.rope_theta, False, args.rope_scaling,
                         args.max_position_embeddings)
        norm = lambda: LayerNorm(args.hidden_size, args.norm_epsilon)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          bias=args.use_bias),
                DenseMLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                         args.use_bias, names=("c_fc", "c_proj")),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [args.sliding_window] * args.num_hidden_layers
