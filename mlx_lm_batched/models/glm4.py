"""GLM 4 (0414): sandwich-normed blocks (``post_self_attn_layernorm`` after attention,
``post_mlp_layernorm`` after the MLP), a fused ``gate_up_proj``, biased q/k/v, and
interleaved RoPE over only the first ``partial_rotary_factor`` of each head."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import MLP, Attention, CausalLM, DecoderStack, RMSNorm, SandwichBlock
from .rope import make_rope

NORM_NAMES = ("input_layernorm", "post_self_attn_layernorm",
              "post_attention_layernorm", "post_mlp_layernorm")


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
    rms_norm_eps: float = 1.5625e-07
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    partial_rotary_factor: float = 0.5
    hidden_act: str = "silu"
    attention_bias: bool = True
    tie_word_embeddings: bool = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        rope = make_rope(int(head_dim * args.partial_rotary_factor), args.rope_theta, True,
                         args.rope_scaling, args.max_position_embeddings)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            SandwichBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          bias=args.attention_bias, o_bias=False),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                    fused_gate_up=True),
                norm,
                norm_names=NORM_NAMES,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [None] * args.num_hidden_layers
