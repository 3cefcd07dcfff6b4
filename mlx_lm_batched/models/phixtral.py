"""Phixtral: Phi-2 parallel blocks (one LayerNorm feeding attention and experts) whose
MLP is a mixture of ungated GELU (tanh) experts (``fc1``/``fc2``, softmax over the top-k
logits), fused ``Wqkv`` with partial RoPE, and a LayerNorm + biased output head.

Checkpoint names (``transformer.h.{i}.mixer.Wqkv`` ...) are mapped to the shared
layers' names in ``sanitize``."""

import re
from dataclasses import dataclass

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import ParallelBlock
from ..layers.moe import SparseMoE, SwitchMLP, stack_experts
from ..layers.norms import LayerNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .args import BaseModelArgs
from .common import init_causal_lm

RENAMES = [  # checkpoint name pattern -> ours
    (r"^transformer\.embd\.wte\.", "model.embed_tokens."),
    (r"^transformer\.h\.(\d+)\.mixer\.Wqkv\.", r"model.layers.\1.self_attn.qkv_proj."),
    (r"^transformer\.h\.(\d+)\.mixer\.out_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^transformer\.h\.(\d+)\.ln\.", r"model.layers.\1.input_layernorm."),
    (r"^transformer\.h\.(\d+)\.moe\.", r"model.layers.\1.mlp."),
    (r"^lm_head\.ln\.", "model.norm."),
    (r"^lm_head\.linear\.", "lm_head."),
]


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    num_vocab: int = 51200
    model_dim: int = 2560
    num_heads: int = 32
    num_layers: int = 32
    rotary_dim: int = 32
    num_experts_per_tok: int = 2
    num_local_experts: int = 4
    layer_norm_epsilon: float = 1e-5

    # The names init_causal_lm reads.
    @property
    def vocab_size(self):
        return self.num_vocab

    @property
    def hidden_size(self):
        return self.model_dim

    tie_word_embeddings = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        dims, head_dim = args.model_dim, args.model_dim // args.num_heads
        rope = make_rope(args.rotary_dim, 10000.0)
        norm = lambda: LayerNorm(dims, args.layer_norm_epsilon)
        layers = [
            ParallelBlock(
                Attention(dims, args.num_heads, args.num_heads, head_dim, rope,
                          projections=Projections(bias=True, fused_qkv=True)),
                SparseMoE(dims, 4 * dims, args.num_local_experts, args.num_experts_per_tok,
                          normalize=True, switch=SwitchMLP(dims, 4 * dims, args.num_local_experts,
                                                           "gelu_new", bias=True)),
                norm, norm_names=("input_layernorm",),
            )
            for _ in range(args.num_layers)
        ]
        init_causal_lm(self, args, layers, norm(), head_bias=True)

    def sanitize(self, weights):
        out = {}
        for key, value in weights.items():
            for pattern, repl in RENAMES:
                key = re.sub(pattern, repl, key)
            out[key] = value
        for i in range(self.args.num_layers):  # per-expert checkpoints: mlp.{e}.fc1 ...
            stack_experts(out, f"model.layers.{i}.mlp", self.args.num_local_experts,
                          names={"fc1": "fc1", "fc2": "fc2"}, src="mlp")
        return super().sanitize(out)
