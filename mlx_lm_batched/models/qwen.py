"""Qwen (1): llama blocks under Qwen-1's names: fused biased ``c_attn`` (q, k, v),
``c_proj`` out, an MLP ``c_proj(silu(w2(x)) * w1(x))`` of ``intermediate_size / 2``,
RMS ``ln_1``/``ln_2``. As in mlx-lm, the reference code's long-context tricks
(``use_dynamic_ntk``, ``use_logn_attn``) are not applied."""

import re
from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm

RENAMES = [  # checkpoint name pattern -> ours
    (r"^transformer\.wte\.", "model.embed_tokens."),
    (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."),
    (r"\.attn\.c_attn\.", ".self_attn.qkv_proj."),
    (r"\.attn\.c_proj\.", ".self_attn.o_proj."),
    (r"\.mlp\.w2\.", ".mlp.gate_proj."),
    (r"\.mlp\.w1\.", ".mlp.up_proj."),
    (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
    (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."),
]


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int = 2048
    num_attention_heads: int = 16
    num_hidden_layers: int = 24
    intermediate_size: int = 11008
    layer_norm_epsilon: float = 1e-6
    no_bias: bool = True
    vocab_size: int = 151936
    rotary_emb_base: float = 10000.0
    tie_word_embeddings: bool = False
    kv_channels: Optional[int] = None  # the head size: hidden_size / num_attention_heads
    max_position_embeddings: Optional[int] = None  # the context length (seq_length)

    def __post_init__(self):
        head_dim = self.hidden_size // self.num_attention_heads
        if self.kv_channels not in (None, head_dim):
            raise NotImplementedError(f"{self.model_type}: kv_channels={self.kv_channels} "
                                      f"must be hidden_size / num_attention_heads = {head_dim}")


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        heads = args.num_attention_heads
        head_dim = args.hidden_size // heads
        rope = make_rope(head_dim, args.rotary_emb_base)
        norm = lambda: RMSNorm(args.hidden_size, args.layer_norm_epsilon)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, heads, heads, head_dim, rope,
                          projections=Projections(bias=True, o_bias=not args.no_bias,
                                                  fused_qkv=True)),
                MLP(args.hidden_size, args.intermediate_size // 2, bias=not args.no_bias),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), head_bias=not args.no_bias)

    def sanitize(self, weights):
        out = {}
        for key, value in weights.items():
            for pattern, repl in RENAMES:
                key = re.sub(pattern, repl, key)
            out[key] = value
        return super().sanitize(out)
