"""InternLM 2: llama blocks under InternLM's names, with one ``wqkv`` projection whose
rows are grouped per key/value head (that head's queries, its key, its value);
``sanitize`` regroups them into the shared fused ``qkv_proj`` (all q, all k, all v)."""

import re
from dataclasses import dataclass

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm

RENAMES = [  # checkpoint name pattern -> ours
    (r"^model\.tok_embeddings\.", "model.embed_tokens."),
    (r"\.attention\.wqkv\.", ".self_attn.qkv_proj."),
    (r"\.attention\.wo\.", ".self_attn.o_proj."),
    (r"\.feed_forward\.w1\.", ".mlp.gate_proj."),
    (r"\.feed_forward\.w3\.", ".mlp.up_proj."),
    (r"\.feed_forward\.w2\.", ".mlp.down_proj."),
    (r"\.attention_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"^output\.", "lm_head."),
]


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    bias: bool = True
    rope_traditional: bool = False


def regroup_wqkv(w, n_kv, head_dim):
    """Rows ``(n_kv, groups + 2, head_dim, ...)`` -> all q rows, all k, all v."""
    grouped = w.reshape(n_kv, -1, head_dim, *w.shape[1:])
    parts = [grouped[:, :-2], grouped[:, -2:-1], grouped[:, -1:]]
    return mx.concatenate([p.reshape(-1, *w.shape[1:]) for p in parts], axis=0)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim, args.rope_traditional)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope,
                          projections=Projections(bias=args.bias, fused_qkv=True)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        out = {}
        for key, value in weights.items():
            if "attention.rope.inv_freq" in key:
                continue
            renamed = key
            for pattern, repl in RENAMES:
                renamed = re.sub(pattern, repl, renamed)
            if ".attention.wqkv." in key:  # InternLM's grouping (ours is left as is)
                value = regroup_wqkv(value, self.args.num_key_value_heads, self.args.head_dim)
            out[renamed] = value
        return super().sanitize(out)
