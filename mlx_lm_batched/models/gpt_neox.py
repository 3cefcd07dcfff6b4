"""GPT-NeoX (Pythia, ...): parallel residual with two biased LayerNorms (or the
sequential form), a fused per-head ``query_key_value``, partial rotary and an
ungated MLP."""

import re
from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import ParallelBlock, PreNormBlock
from ..layers.mlp import DenseMLP
from ..layers.norms import LayerNorm
from ..layers.stack import CausalLM
from .args import BaseModelArgs, require_values
from .common import config_rope, init_causal_lm

_RENAMES = [
    (r"^embed_in\.", "model.embed_tokens."),
    (r"^final_layer_norm\.", "model.norm."),
    (r"^embed_out\.", "lm_head."),
    (r"^(?:layers|h)\.(\d+)\.attention\.query_key_value\.", r"model.layers.\1.self_attn.qkv_proj."),
    (r"^(?:layers|h)\.(\d+)\.attention\.dense\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^(?:layers|h)\.(\d+)\.", r"model.layers.\1."),
]


def per_head_qkv_to_fused(v, n_heads):
    """Rows ordered ``(head, q/k/v, dim)`` -> ``(q/k/v, head, dim)``: the layout of
    ``Projections(fused_qkv=True)``. Works on weights, biases and quantized tensors."""
    return v.reshape(n_heads, 3, -1, *v.shape[1:]).swapaxes(0, 1).reshape(v.shape)


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int
    intermediate_size: Optional[int] = None  # 4 x hidden_size (mlx-lm always uses that)
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    rope_theta: Optional[float] = None
    rotary_emb_base: float = 10000.0  # transformers-4 name of rope_theta
    partial_rotary_factor: Optional[float] = None
    rotary_pct: float = 0.25  # transformers-4 name of partial_rotary_factor
    rope_scaling: Optional[dict] = None
    use_parallel_residual: bool = True
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    num_key_value_heads: Optional[int] = None  # mlx-lm's field; GPT-NeoX has no GQA

    def __post_init__(self):
        require_values(self, num_key_value_heads=(None, self.num_attention_heads))
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.rope_theta is None:
            self.rope_theta = self.rotary_emb_base
        if self.partial_rotary_factor is None:
            self.partial_rotary_factor = self.rotary_pct


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, h = args.hidden_size, args.num_attention_heads
        head_dim = d // h
        rope = config_rope(args, int(head_dim * args.partial_rotary_factor))
        norm = lambda: LayerNorm(d, args.layer_norm_eps)
        block = ParallelBlock if args.use_parallel_residual else PreNormBlock
        layers = [
            block(
                Attention(d, h, h, head_dim, rope,
                          projections=Projections(bias=args.attention_bias, fused_qkv=True)),
                DenseMLP(d, args.intermediate_size, args.hidden_act,
                         names=("dense_h_to_4h", "dense_4h_to_h")),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            if k.endswith((".attention.bias", ".attention.masked_bias")):
                continue  # causal-mask buffers
            name = re.sub(r"^(gpt_neox|model)\.", "", k)
            for pattern, repl in _RENAMES:
                name, n = re.subn(pattern, repl, name)
                if n:
                    break
            if ".query_key_value." in k:
                v = per_head_qkv_to_fused(v, self.args.num_attention_heads)
            out[name if name.startswith(("model.", "lm_head.")) else k] = v
        return super().sanitize(out)
