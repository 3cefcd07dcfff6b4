"""Phi (1, 1.5, 2): parallel attention + MLP off one biased LayerNorm, biased q/k/v
and dense projections, partial rotary, an ungated MLP and a biased output head."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import ParallelBlock
from ..layers.mlp import DenseMLP
from ..layers.norms import LayerNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    # mlx-lm's defaults (phi-2's sizes) for what a config leaves out: ``ModelArgs()``
    # builds phi-2 there and here.
    model_type: str = "phi"
    hidden_size: int = 2560
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    vocab_size: int = 51200
    intermediate_size: Optional[int] = None  # 4 x hidden_size (DecoderArgs)
    hidden_act: str = "gelu_new"
    layer_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    partial_rotary_factor: float = 0.5
    qk_layernorm: bool = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, int(head_dim * args.partial_rotary_factor))
        norm = lambda dims=args.hidden_size: LayerNorm(dims, args.layer_norm_eps)
        layers = [
            ParallelBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          qk_norm=(QKNorm(norm, names=("q_layernorm", "k_layernorm"))
                                   if args.qk_layernorm else None),
                          projections=Projections(bias=True)),
                DenseMLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                         names=("fc1", "fc2")),
                norm, norm_names=("input_layernorm",),
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), head_bias=True)

    def sanitize(self, weights):
        weights = {
            k.replace(".self_attn.dense.", ".self_attn.o_proj.")
             .replace("model.final_layernorm.", "model.norm."): v
            for k, v in weights.items()
        }
        if "lm_head.weight" not in weights:  # tied: the head keeps its own bias
            for part in ("weight", "scales", "biases"):
                if f"model.embed_tokens.{part}" in weights:
                    weights[f"lm_head.{part}"] = weights[f"model.embed_tokens.{part}"]
        return super().sanitize(weights)
