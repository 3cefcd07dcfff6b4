"""DBRX: pre-norm blocks (bias-free LayerNorms) with a fused, clamped ``Wqkv`` and a
softmax top-k router whose chosen weights are divided by their p-norm
(``moe_normalize_expert_weights``) over SwiGLU experts stored as flat
``(experts * ffn, hidden)`` matrices ``w1``/``v1``/``w2``. Config fields are nested
under ``attn_config`` and ``ffn_config``; names are mapped in ``sanitize``."""

import re
from dataclasses import dataclass, field

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import activation
from ..layers.moe import SparseMoE, softmax_topk
from ..layers.norms import LayerNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm

RENAMES = [  # checkpoint name pattern -> ours
    (r"^transformer\.wte\.", "model.embed_tokens."),
    (r"^transformer\.norm_f\.", "model.norm."),
    (r"^transformer\.blocks\.(\d+)\.norm_attn_norm\.norm_1\.", r"model.layers.\1.input_layernorm."),
    (r"^transformer\.blocks\.(\d+)\.norm_attn_norm\.norm_2\.",
     r"model.layers.\1.post_attention_layernorm."),
    (r"^transformer\.blocks\.(\d+)\.norm_attn_norm\.attn\.Wqkv\.", r"model.layers.\1.self_attn.qkv_proj."),
    (r"^transformer\.blocks\.(\d+)\.norm_attn_norm\.attn\.out_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^transformer\.blocks\.(\d+)\.ffn\.router\.layer\.", r"model.layers.\1.mlp.gate."),
    (r"^transformer\.blocks\.(\d+)\.ffn\.experts\.mlp\.", r"model.layers.\1.mlp.experts."),
]
EXPERTS = {"w1": "gate_proj", "v1": "up_proj", "w2": "down_proj"}


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    d_model: int = 6144
    n_heads: int = 48
    n_layers: int = 40
    max_seq_len: int = 32768
    vocab_size: int = 100352
    attn_config: dict = field(default_factory=dict)
    ffn_config: dict = field(default_factory=dict)
    tie_word_embeddings: bool = False

    @property
    def hidden_size(self):  # the name init_causal_lm reads
        return self.d_model

    @property
    def rope_theta(self):
        return self.attn_config.get("rope_theta", 10000.0)


class DbrxMoE(SparseMoE):
    """Softmax top-k with the chosen weights divided by their p-norm (None: as is)."""

    def __init__(self, args, p):
        ffn = args.ffn_config
        act = activation((ffn.get("ffn_act_fn") or {}).get("name", "silu"))
        super().__init__(args.d_model, ffn.get("ffn_hidden_size", 3584),
                         ffn.get("moe_num_experts", 4), ffn.get("moe_top_k", 1), act)
        self.p = p

    def route(self, x):
        indices, weights = softmax_topk(self.gate(x), self.top_k)
        if self.p is not None:
            norm = mx.power(mx.power(mx.abs(weights), self.p).sum(-1, keepdims=True), 1 / self.p)
            weights = weights / norm
        return indices, weights


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        attn = args.attn_config
        head_dim = args.d_model // args.n_heads
        rope = make_rope(head_dim, args.rope_theta)
        p = args.ffn_config.get("moe_normalize_expert_weights", 1.0)
        norm = lambda: LayerNorm(args.d_model, 1e-5, bias=False)
        layers = [
            PreNormBlock(
                Attention(args.d_model, args.n_heads, attn.get("kv_n_heads", 1), head_dim, rope,
                          projections=Projections(fused_qkv=True, clip=attn.get("clip_qkv"))),
                DbrxMoE(args, p),
                norm,
            )
            for _ in range(args.n_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        out = {}
        E = self.args.ffn_config.get("moe_num_experts", 4)
        for key, value in weights.items():
            for pattern, repl in RENAMES:
                key = re.sub(pattern, repl, key)
            m = re.match(r"^(model\.layers\.\d+\.mlp)\.experts\.(w1|v1|w2)$", key)
            if m:  # flat (E * ffn, hidden) -> stacked switch weights
                value = value.reshape(E, -1, value.shape[-1])
                if m.group(2) == "w2":
                    value = value.swapaxes(1, 2)
                key = f"{m.group(1)}.switch_mlp.{EXPERTS[m.group(2)]}.weight"
            out[key] = value
        return super().sanitize(out)
