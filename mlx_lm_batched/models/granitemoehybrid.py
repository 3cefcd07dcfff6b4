"""Granite 4 (GraniteMoeHybrid): Mamba-2 and attention layers (RoPE only when
``position_embedding_type == "rope"``), each followed by Granite MoE experts plus a
shared SwiGLU MLP, with Granite's multipliers (embeddings, residual branches,
attention scale, logits divisor)."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.attention_options import Projections, Scores
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d
from ..layers.stack import CausalLM
from . import granitemoe
from .common import attention_dims, config_rope, init_causal_lm
from .mamba2 import Mamba2Mixer, SSDDims

_KINDS = {"linear_attention": "mamba", "full_attention": "attention"}


@dataclass
class ModelArgs(granitemoe.ModelArgs):
    shared_intermediate_size: int = 1024
    position_embedding_type: Optional[str] = None
    layer_types: Optional[List[str]] = None
    layers_block_type: Optional[List[str]] = None
    mamba_n_heads: int = 128
    mamba_n_groups: int = 1
    mamba_d_state: int = 256
    mamba_d_head: int = 64
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    time_step_limit: Optional[list] = None
    tie_word_embeddings: bool = False

    def __post_init__(self):
        kinds = self.layers_block_type or self.layer_types or ["mamba"] * self.num_hidden_layers
        self.layers_block_type = [_KINDS.get(k, k) for k in kinds]


class Block(nn.Module):
    """``h = x + r * mixer(norm1(x)); out = h + r * (moe(norm2(h)) + shared(norm2(h)))``."""

    def __init__(self, args, kind, rope):
        super().__init__()
        self.kind = kind
        if kind == "mamba":
            dims = SSDDims(args.mamba_n_heads, args.mamba_d_head, args.mamba_d_state,
                           args.mamba_n_groups, args.mamba_d_conv)
            self.mamba = Mamba2Mixer(args.hidden_size, dims, args.rms_norm_eps,
                                     args.mamba_proj_bias, args.mamba_conv_bias,
                                     args.time_step_limit)
        else:
            n_kv, head_dim = attention_dims(args)
            self.self_attn = Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                                       rope, projections=Projections(bias=args.attention_bias),
                                       scores=Scores(scale=args.attention_multiplier))
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if args.num_local_experts:
            self.block_sparse_moe = granitemoe.GraniteMoE(args)
        self.shared_mlp = MLP(args.hidden_size, args.shared_intermediate_size, args.hidden_act,
                              fused_gate_up=True)
        self.r = args.residual_multiplier

    def __call__(self, x, mask, offset, cache=None, attention=None):
        mixer = self.mamba if self.kind == "mamba" else self.self_attn
        h = x + self.r * mixer(self.input_layernorm(x), mask, offset, cache, attention)
        n = self.post_attention_layernorm(h)
        y = self.shared_mlp(n)
        if "block_sparse_moe" in self:
            y = y + self.block_sparse_moe(n)
        return h + self.r * y


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        _, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim) if args.position_embedding_type == "rope" else None
        layers = [Block(args, kind, rope) for kind in args.layers_block_type]
        init_causal_lm(self, args, layers, RMSNorm(args.hidden_size, args.rms_norm_eps),
                       embed_scale=args.embedding_multiplier)

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs) / self.args.logits_scaling

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per Mamba-2 layer, a key/value cache per attention layer."""
        return [StateCache(2) if k == "mamba"
                else KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size)
                for k in self.args.layers_block_type]

    def sanitize(self, weights):
        out = {}
        for k, v in super().sanitize(weights).items():
            if k.endswith("block_sparse_moe.input_linear.weight"):  # fused experts: gate, up
                prefix = k[: -len("input_linear.weight")] + "switch_mlp."
                out[prefix + "gate_proj.weight"], out[prefix + "up_proj.weight"] = mx.split(v, 2, 1)
                continue
            k = k.replace("block_sparse_moe.output_linear.", "block_sparse_moe.switch_mlp.down_proj.")
            k = k.replace("shared_mlp.input_linear.", "shared_mlp.gate_up_proj.")
            k = k.replace("shared_mlp.output_linear.", "shared_mlp.down_proj.")
            if k.endswith("conv1d.weight"):
                v = CausalConv1d.sanitize_weight(v, self.args.mamba_d_conv)
            out[k] = v
        return out
