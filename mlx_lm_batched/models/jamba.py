"""Jamba: Mamba layers (with weighted RMS norms on dt, B and C) interleaved with
attention layers without RoPE every ``attn_layer_period``, and a softmax top-k MoE
(unnormalised weights) every ``expert_layer_period`` layers."""

from dataclasses import dataclass
from typing import Optional

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.mlp import MLP
from ..layers.moe import SparseMoE, stack_experts
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d, HybridBlock
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, init_causal_lm
from .mamba import MambaMixer, SSMDims


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-6
    num_experts: int = 16
    num_experts_per_tok: int = 2
    expert_layer_period: int = 2
    expert_layer_offset: int = 1
    attn_layer_period: int = 8
    attn_layer_offset: int = 4
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_dt_rank: Optional[int] = None
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    layers_block_type: Optional[list] = None

    def __post_init__(self):
        if self.mamba_dt_rank in (None, "auto"):
            self.mamba_dt_rank = -(-self.hidden_size // 16)

    def is_attention(self, i):
        return i % self.attn_layer_period == self.attn_layer_offset

    def is_moe(self, i):
        return self.num_experts > 1 and i % self.expert_layer_period == self.expert_layer_offset


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        layers = []
        for i in range(args.num_hidden_layers):
            if args.is_attention(i):
                mixer, name = Attention(args.hidden_size, args.num_attention_heads, n_kv,
                                        head_dim, None), "self_attn"
            else:
                dims = SSMDims(args.mamba_expand * args.hidden_size, args.mamba_d_state,
                               args.mamba_dt_rank, args.mamba_d_conv)
                mixer = MambaMixer(args.hidden_size, dims, args.mamba_proj_bias,
                                   args.mamba_conv_bias, "weighted", args.rms_norm_eps)
                name = "mamba"
            mlp = (SparseMoE(args.hidden_size, args.intermediate_size, args.num_experts,
                             args.num_experts_per_tok) if args.is_moe(i)
                   else MLP(args.hidden_size, args.intermediate_size, args.hidden_act))
            layers.append(HybridBlock(mixer, mlp, norm,
                                      (name, "feed_forward", "input_layernorm", "pre_ff_layernorm")))
        init_causal_lm(self, args, layers, norm())

    def make_cache(self, max_kv_size=None):
        """A key/value cache per attention layer, a ``StateCache`` per Mamba layer."""
        return [(KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size))
                if self.args.is_attention(i) else StateCache(2)
                for i in range(self.args.num_hidden_layers)]

    def sanitize(self, weights):
        out = {}
        for name, w in super().sanitize(weights).items():
            name = name.replace("model.final_layernorm.", "model.norm.")
            name = name.replace("feed_forward.router.", "feed_forward.gate.")
            if name.endswith("conv1d.weight"):
                w = CausalConv1d.sanitize_weight(w, self.args.mamba_d_conv)
            out[name] = w
        for i in range(self.args.num_hidden_layers):
            if self.args.is_moe(i):
                stack_experts(out, f"model.layers.{i}.feed_forward", self.args.num_experts)
        return out
