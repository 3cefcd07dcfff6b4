"""Granite (3.x): llama blocks with four scalar knobs: ``embedding_multiplier`` on
the embeddings, ``attention_multiplier`` as the attention scale,
``residual_multiplier`` on each branch before the residual add, and logits divided
by ``logits_scaling``."""

from dataclasses import dataclass

from ..layers.attention import Attention
from ..layers.attention_options import Projections, Scores
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    mlp_bias: bool = False
    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0


class Model(CausalLM):
    def __init__(self, args: ModelArgs, make_mlp=None, mlp_name="mlp"):
        """``make_mlp``: builds each layer's MLP (Granite MoE: the sparse experts)."""
        super().__init__()
        n_kv, head_dim = args.num_key_value_heads, args.head_dim
        rope = config_rope(args, head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        make_mlp = make_mlp or (lambda: MLP(args.hidden_size, args.intermediate_size,
                                            args.hidden_act, args.mlp_bias))
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          projections=Projections(bias=args.attention_bias),
                          scores=Scores(scale=args.attention_multiplier)),
                make_mlp(),
                norm,
                residual_scale=args.residual_multiplier,
                mlp_name=mlp_name,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), embed_scale=args.embedding_multiplier)
        self.logit_scale = 1.0 / args.logits_scaling
