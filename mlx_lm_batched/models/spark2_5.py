"""Spark 2.5: pre-norm blocks of sliding-window and full attention layers (each type
its own RoPE from the per-type ``rope_parameters``); one fused ``q_k_v_proj``; a
sigmoid output gate per head (``g_proj``); GELU-gated MLPs; tied embeddings named
``embedding``, attention output named ``out_proj`` (renamed on load)."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.attention import OutputGatedAttention
from ..layers.attention_options import OutputGate, Projections
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, init_causal_lm, layer_type_rope, type_windows

# The checkpoint's names -> ours.
RENAMES = {".self_attn.q_k_v_proj.": ".self_attn.qkv_proj.",
           ".self_attn.out_proj.": ".self_attn.o_proj.",
           "model.embedding.": "model.embed_tokens."}


@dataclass
class ModelArgs(DecoderArgs):
    sliding_window: Optional[int] = None
    layer_types: Optional[List[str]] = None
    rope_parameters_by_type: Optional[dict] = None
    rope_local_base_freq: Optional[float] = None
    partial_rotary_factor: Optional[float] = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: Optional[int] = 8192
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "gelu"
    gate_attn_act_mode: str = "sigmoid"
    headwise_attn_output_gate: bool = True
    tie_word_embeddings: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:
            pattern = ["sliding_attention"] * 3 + ["full_attention"]
            self.layer_types = [pattern[i % 4] for i in range(self.num_hidden_layers)]
        if self.gate_attn_act_mode != "sigmoid":
            raise ValueError(f"spark2_5: gate_attn_act_mode '{self.gate_attn_act_mode}' is "
                             "not supported (sigmoid only)")


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        ropes = {t: layer_type_rope(args, t) for t in set(args.layer_types)}
        layers = [
            PreNormBlock(
                OutputGatedAttention(args.hidden_size, args.num_attention_heads,
                                     args.num_key_value_heads, args.head_dim, ropes[t],
                                     OutputGate(per_head=args.headwise_attn_output_gate,
                                                name="g_proj", bias=args.attention_bias),
                                     projections=Projections(bias=args.attention_bias,
                                                             fused_qkv=True)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.mlp_bias),
                norm,
            )
            for t in args.layer_types
        ]
        init_causal_lm(self, args, layers, norm(),
                       type_windows(args.layer_types, args.sliding_window))
        for layer, kind in zip(layers, args.layer_types):
            layer.is_sliding = kind == "sliding_attention"  # mlx-lm's attribute

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            for old, new in RENAMES.items():
                k = k.replace(old, new)
            out[k] = v
        return super().sanitize(out)
