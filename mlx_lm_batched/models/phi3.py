"""Phi 3 / 3.5 / 4-mini: llama blocks with a fused ``qkv_proj`` and ``gate_up_proj``,
LongRoPE (``longrope``; configs may say ``su`` or, for Phi 3, ``yarn``), optional
partial rotary and an optional sliding window on every layer."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import MLP, Attention, CausalLM, DecoderStack, PreNormBlock, RMSNorm
from .rope import make_rope


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: Optional[int] = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    original_max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    partial_rotary_factor: float = 1.0
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    sliding_window: Optional[int] = None

    def __post_init__(self):
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
        self.args = args
        self.model_type = args.model_type
        n_kv = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.hidden_size // args.num_attention_heads
        rope = make_rope(int(head_dim * args.partial_rotary_factor), args.rope_theta, False,
                         args.rope_scaling, args.max_position_embeddings)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          fused_qkv=True),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, fused_gate_up=True),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [args.sliding_window] * args.num_hidden_layers
