"""GLM (GLM-4-9B, ``glm``): llama pre-norm blocks with a fused ``gate_up_proj``,
biased q/k/v, and interleaved RoPE over the first ``partial_rotary_factor`` of each
head. (GLM 4 0414 adds sandwich norms: ``glm4.py``.)"""

import mlx.nn as nn

from .glm4 import ModelArgs  # noqa: F401  (the same config fields)
from .layers import MLP, Attention, CausalLM, DecoderStack, PreNormBlock, RMSNorm
from .rope import make_rope


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
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          bias=args.attention_bias, o_bias=False),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, fused_gate_up=True),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [None] * args.num_hidden_layers
