"""Granite MoE: Mixtral-shaped blocks with Granite's multipliers (embeddings, residual
branches, attention scale, logits divisor). The router takes the top-k logits and
softmaxes over them; experts come fused (``input_linear`` = gate then up)."""

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from .base import BaseModelArgs
from .layers import Attention, CausalLM, DecoderStack, PreNormBlock, RMSNorm, activation
from .moe import SparseMoE, softmax_topk
from .rope import make_rope


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    rms_norm_eps: float = 1e-6
    num_key_value_heads: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    hidden_act: str = "silu"
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    logits_scaling: float = 1.0


class GraniteMoE(SparseMoE):
    """The router is ``router.layer``; softmax over the top-k logits equals the top-k
    softmax probabilities renormalised."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.hidden_size, args.intermediate_size, args.num_local_experts,
                         args.num_experts_per_tok, activation(args.hidden_act), normalize=True)
        self.pop("gate")
        self.router = nn.Module()
        self.router.layer = nn.Linear(args.hidden_size, args.num_local_experts, bias=False)

    def route(self, x):
        return softmax_topk(self.router.layer(x), self.top_k, normalize=True)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.hidden_size // args.num_attention_heads
        rope = make_rope(head_dim, args.rope_theta, False, args.rope_scaling,
                         args.max_position_embeddings)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          bias=args.attention_bias, scale=args.attention_multiplier),
                GraniteMoE(args),
                norm,
                residual_scale=args.residual_multiplier,
                mlp_name="block_sparse_moe",
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm(),
                                  embed_scale=args.embedding_multiplier)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [None] * args.num_hidden_layers

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs) / self.args.logits_scaling

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        out = {}
        for k, v in weights.items():
            if k.endswith("block_sparse_moe.input_linear.weight"):
                gate, up = mx.split(v, 2, axis=1)
                prefix = k[: -len("input_linear.weight")] + "switch_mlp."
                out[prefix + "gate_proj.weight"] = gate
                out[prefix + "up_proj.weight"] = up
                continue
            k = k.replace("block_sparse_moe.output_linear.", "block_sparse_moe.switch_mlp.down_proj.")
            out[k] = v
        return out
