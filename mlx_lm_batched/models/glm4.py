"""GLM 4 (0414): sandwich-normed blocks (``post_self_attn_layernorm`` after attention,
``post_mlp_layernorm`` after the MLP), a fused ``gate_up_proj``, biased q/k/v, and
interleaved RoPE over only the first ``partial_rotary_factor`` of each head."""

from dataclasses import dataclass

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock, SandwichBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm

NORM_NAMES = ("input_layernorm", "post_self_attn_layernorm",
              "post_attention_layernorm", "post_mlp_layernorm")


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1.5625e-07
    partial_rotary_factor: float = 0.5
    attention_bias: bool = True


class Model(CausalLM):
    def __init__(self, args: ModelArgs, sandwich=True):
        """``sandwich=False``: plain pre-norm blocks (the original GLM, ``glm.py``)."""
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, int(head_dim * args.partial_rotary_factor), traditional=True)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        block = (lambda a, m: SandwichBlock(a, m, norm, norm_names=NORM_NAMES)) if sandwich \
            else (lambda a, m: PreNormBlock(a, m, norm))
        layers = [
            block(Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                            projections=Projections(bias=args.attention_bias, o_bias=False)),
                  MLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                      fused_gate_up=True))
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())
