"""Granite (3.x): llama blocks with four scalar knobs: ``embedding_multiplier`` on
the embeddings, ``attention_multiplier`` as the attention scale,
``residual_multiplier`` on each branch before the residual add, and logits divided
by ``logits_scaling``."""

from dataclasses import dataclass
from typing import Optional

from .base import BaseModelArgs
from .common import attention_dims, config_rope, init_causal_lm
from .layers import MLP, Attention, CausalLM, PreNormBlock, RMSNorm


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: Optional[int] = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    tie_word_embeddings: bool = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs, make_mlp=None, mlp_name="mlp"):
        """``make_mlp``: builds each layer's MLP (Granite MoE: the sparse experts)."""
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        make_mlp = make_mlp or (lambda: MLP(args.hidden_size, args.intermediate_size,
                                            args.hidden_act, args.mlp_bias))
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          bias=args.attention_bias, scale=args.attention_multiplier),
                make_mlp(),
                norm,
                residual_scale=args.residual_multiplier,
                mlp_name=mlp_name,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), embed_scale=args.embedding_multiplier)

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs) / self.args.logits_scaling
