"""OpenELM (Apple): layer-wise scaling, so every layer has its own query and
key/value head counts (``num_query_heads[i]``, ``num_kv_heads[i]``) and MLP width
(``ffn_multipliers[i] * model_dim``, rounded to ``ffn_dim_divisor``); a fused
``qkv_proj`` with per-head QK RMS-norm before RoPE; a fused gated MLP (``proj_1``
holds gate then up); tied embeddings unless ``share_input_output_layers`` is off.

Checkpoint names (``transformer.layers.{i}.attn.qkv_proj`` ...) are mapped to the
shared layers' in ``sanitize``. The non-GLU MLP variant (``ffn_with_glu: false``,
no released checkpoint) is refused."""

import re
from dataclasses import dataclass
from typing import List

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm

_RENAMES = [
    (r"^transformer\.token_embeddings\.", "model.embed_tokens."),
    (r"^transformer\.norm\.", "model.norm."),
    (r"^transformer\.layers\.(\d+)\.attn\.out_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^transformer\.layers\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
    (r"^transformer\.layers\.(\d+)\.ffn\.proj_1\.", r"model.layers.\1.mlp.gate_up_proj."),
    (r"^transformer\.layers\.(\d+)\.ffn\.proj_2\.", r"model.layers.\1.mlp.down_proj."),
    (r"^transformer\.layers\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^transformer\.layers\.(\d+)\.ffn_norm\.", r"model.layers.\1.post_attention_layernorm."),
]


def make_divisible(v, divisor=8):
    """OpenELM's rounding of a width to a multiple of ``divisor`` (never more than
    10% below ``v``)."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    head_dim: int
    num_transformer_layers: int
    model_dim: int
    vocab_size: int
    num_query_heads: List[int]
    num_kv_heads: List[int]
    ffn_multipliers: List[float]
    ffn_dim_divisor: int = 256
    ffn_with_glu: bool = True
    normalize_qk_projections: bool = True
    share_input_output_layers: bool = True
    rms_norm_eps: float = 1e-6
    rope_freq_constant: float = 10000.0

    def __post_init__(self):
        if not self.ffn_with_glu:
            raise NotImplementedError("openelm: ffn_with_glu=false (an ungated MLP) is not "
                                      "supported")

    # The names init_causal_lm reads.
    @property
    def hidden_size(self):
        return self.model_dim

    @property
    def tie_word_embeddings(self):
        return self.share_input_output_layers


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, hd = args.model_dim, args.head_dim
        rope = make_rope(hd, args.rope_freq_constant)
        norm = lambda dims=d: RMSNorm(dims, args.rms_norm_eps)
        qk_norm = QKNorm(norm) if args.normalize_qk_projections else None
        layers = [
            PreNormBlock(
                Attention(d, args.num_query_heads[i], args.num_kv_heads[i], hd, rope,
                          qk_norm=qk_norm, projections=Projections(fused_qkv=True)),
                MLP(d, make_divisible(args.ffn_multipliers[i] * d, args.ffn_dim_divisor),
                    fused_gate_up=True),
                norm,
            )
            for i in range(args.num_transformer_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            for pattern, repl in _RENAMES:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            out[k] = v
        return super().sanitize(out)
