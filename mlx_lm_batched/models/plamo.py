"""PLaMo (Preferred Networks, v1): parallel attention + SwiGLU MLP off one RMSNorm
(``norm``), ``ceil(heads / n_shared_head)`` key/value heads and an untied head.

PLaMo shares its key/value heads by tiling: query head ``h`` reads key/value head
``h % kv_heads``, where grouped-query attention reads ``h // n_shared_head``. The
checkpoint's query heads (``q_proj`` rows, ``o_proj`` columns) are reordered once
at load so that the shared grouped attention computes the same thing. Checkpoint
names nest the blocks as ``model.layers.layers.{i}``; only those are reordered."""

import math
import re
from dataclasses import dataclass

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.blocks import ParallelBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    n_shared_head: int = 8
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    tie_word_embeddings: bool = False

    def __post_init__(self):
        self.num_key_value_heads = math.ceil(self.num_attention_heads / self.n_shared_head)
        if self.num_key_value_heads * self.n_shared_head != self.num_attention_heads:
            raise ValueError(f"plamo: num_attention_heads ({self.num_attention_heads}) is "
                             f"not a multiple of n_shared_head ({self.n_shared_head})")


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        head_dim = args.hidden_size // args.num_attention_heads
        rope = make_rope(head_dim, args.rope_theta, args.rope_traditional)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            ParallelBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          head_dim, rope),
                MLP(args.hidden_size, args.intermediate_size),
                norm, norm_names=("norm",),
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        a = self.args
        kv, group = a.num_key_value_heads, a.n_shared_head
        # Our query head g * group + j is the checkpoint's head j * kv + g.
        order = mx.array([j * kv + g for g in range(kv) for j in range(group)])
        out = {}
        for k, v in weights.items():
            name = re.sub(r"^model\.layers\.layers\.", "model.layers.", k)
            if name != k and name.endswith("self_attn.q_proj.weight"):
                v = v.reshape(a.num_attention_heads, -1, v.shape[-1])[order].reshape(v.shape)
            elif name != k and name.endswith("self_attn.o_proj.weight"):
                v = v.reshape(v.shape[0], a.num_attention_heads, -1)[:, order].reshape(v.shape)
            out[name] = v
        return super().sanitize(out)
