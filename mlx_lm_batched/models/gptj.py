"""GPT-J: parallel attention + MLP off one biased LayerNorm (``ln_1``), unbiased
q/k/v/out projections with interleaved (GPT-J style) RoPE on the first
``rotary_dim`` features of each head, an ungated ``gelu_new`` MLP and a biased,
untied head.

Hugging Face names (``transformer.h.{i}.attn.out_proj`` ...) and mlx-lm's converted
ones (``model.h.{i}...``) are mapped to the shared layers' names in ``sanitize``."""

import re
from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.blocks import ParallelBlock
from ..layers.mlp import DenseMLP
from ..layers.norms import LayerNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm

# Checkpoint name (``transformer.`` / ``model.`` prefix removed) -> ours.
_RENAMES = [
    (r"^wte\.", "model.embed_tokens."),
    (r"^ln_f\.", "model.norm."),
    (r"^h\.(\d+)\.attn\.out_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^h\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
    (r"^h\.(\d+)\.ln_1\.", r"model.layers.\1.input_layernorm."),
    (r"^h\.(\d+)\.", r"model.layers.\1."),
]


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    vocab_size: int = 50400
    n_embd: int = 4096
    n_layer: int = 28
    n_head: int = 16
    n_positions: int = 2048
    rotary_dim: Optional[int] = 64
    n_inner: Optional[int] = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = False

    # The names init_causal_lm reads.
    @property
    def hidden_size(self):
        return self.n_embd


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, head_dim = args.n_embd, args.n_embd // args.n_head
        # GPT-J's fixed base; rotate_every_two is the interleaved (traditional) layout.
        rope = make_rope(args.rotary_dim or head_dim, 10000.0, traditional=True)
        norm = lambda: LayerNorm(d, args.layer_norm_epsilon)
        layers = [
            ParallelBlock(
                Attention(d, args.n_head, args.n_head, head_dim, rope),
                DenseMLP(d, args.n_inner or 4 * d, args.activation_function,
                         names=("fc_in", "fc_out")),
                norm, norm_names=("input_layernorm",),
            )
            for _ in range(args.n_layer)
        ]
        init_causal_lm(self, args, layers, norm(), head_bias=True)

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            if k.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # causal-mask buffers
            name = re.sub(r"^(transformer|model)\.", "", k)
            for pattern, repl in _RENAMES:
                name, n = re.subn(pattern, repl, name)
                if n:
                    break
            out[name if name.startswith("model.") else k] = v
        return super().sanitize(out)
