"""Lille 130M (Nikity): pre-norm blocks whose norms live inside the attention and MLP
modules of the checkpoint (``attention.norm``, ``feed_forward.norm``), a fused
``qkv_proj`` with GQA, interleaved (traditional) RoPE, a SwiGLU MLP of width
``256 * round(int(8 * n_embd / 3) / 256)`` and tied embeddings. Checkpoint names
are mapped to the shared layers' in ``sanitize``."""

import re
from dataclasses import dataclass

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm

_RENAMES = [
    (r"^transformer\.tok_embeddings\.", "model.embed_tokens."),
    (r"^transformer\.norm\.", "model.norm."),
    (r"^transformer\.layers\.(\d+)\.attention\.norm\.", r"model.layers.\1.input_layernorm."),
    (r"^transformer\.layers\.(\d+)\.attention\.out_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^transformer\.layers\.(\d+)\.attention\.", r"model.layers.\1.self_attn."),
    (r"^transformer\.layers\.(\d+)\.feed_forward\.norm\.",
     r"model.layers.\1.post_attention_layernorm."),
    (r"^transformer\.layers\.(\d+)\.feed_forward\.", r"model.layers.\1.mlp."),
]


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    n_embd: int
    n_head: int
    n_kv_heads: int
    n_layer: int
    vocab_size: int
    block_size: int = 512
    layer_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if not self.tie_word_embeddings:
            raise NotImplementedError("lille-130m: an untied head is not supported")

    # The name init_causal_lm reads.
    @property
    def hidden_size(self):
        return self.n_embd


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, head_dim = args.n_embd, args.n_embd // args.n_head
        rope = make_rope(head_dim, args.rope_theta, traditional=True)
        norm = lambda: RMSNorm(d, args.layer_norm_eps)
        hidden = 256 * round(int(8 * d / 3) / 256)
        layers = [
            PreNormBlock(Attention(d, args.n_head, args.n_kv_heads, head_dim, rope,
                                   projections=Projections(fused_qkv=True)), MLP(d, hidden), norm)
            for _ in range(args.n_layer)
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
