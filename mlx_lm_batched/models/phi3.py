"""Phi 3 / 3.5 / 4-mini: llama blocks with a fused ``qkv_proj`` and ``gate_up_proj``,
LongRoPE (``longrope``; configs may say ``su`` or, for Phi 3, ``yarn``), optional
partial rotary and an optional sliding window on every layer."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    original_max_position_embeddings: Optional[int] = None
    partial_rotary_factor: float = 1.0
    sliding_window: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        scaling = self.rope_scaling
        if scaling and scaling.get("rope_type", scaling.get("type")) in ("su", "yarn", "longrope"):
            # transformers reads every Phi 3 scaling type as longrope, and the
            # top-level pretraining length wins over the one inside the dict.
            scaling = dict(scaling, rope_type="longrope")
            if self.original_max_position_embeddings:
                scaling["original_max_position_embeddings"] = self.original_max_position_embeddings
            self.rope_scaling = scaling


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, int(head_dim * args.partial_rotary_factor))
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          projections=Projections(fused_qkv=True)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, fused_gate_up=True),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(),
                       [args.sliding_window] * args.num_hidden_layers)
