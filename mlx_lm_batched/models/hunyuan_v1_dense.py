"""Hunyuan (v1, dense): llama blocks with per-head RMS QK-norm applied *after* RoPE
(``query_layernorm``/``key_layernorm``), and "dynamic" RoPE that, given a fixed
``alpha``, only stretches the base: ``theta * alpha ** (d / (d - 2))``."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import MLP, Attention, CausalLM, DecoderStack, PreNormBlock, RMSNorm
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
    rms_norm_eps: float = 1e-5
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    use_qk_norm: bool = True  # transformers-4 era configs; transformers 5 always norms
    tie_word_embeddings: bool = False


def hunyuan_rope(dims, args):
    scaling = args.rope_scaling or {}
    if scaling.get("alpha"):  # NTK-alpha: a fixed larger base, independent of length
        base = args.rope_theta * scaling["alpha"] ** (dims / (dims - 2))
        return make_rope(dims, base)
    return make_rope(dims, args.rope_theta, False, args.rope_scaling,
                     args.max_position_embeddings)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        rope = hunyuan_rope(head_dim, args)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        qk_norm = dict(qk_norm=norm, qk_norm_after_rope=True,
                       qk_norm_names=("query_layernorm", "key_layernorm"))
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          bias=args.attention_bias, **(qk_norm if args.use_qk_norm else {})),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [None] * args.num_hidden_layers
