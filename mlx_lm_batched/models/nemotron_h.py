"""Nemotron-H: one mixer per block (Mamba-2 ``M``, attention without RoPE ``*``,
ReLU² MLP ``-``, or a sigmoid-routed MoE of ReLU² experts ``E``), each pre-normed with
a residual. Only Mamba-2 and attention blocks hold a cache (state / key-value)."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers import masks as masks_lib
from ..layers.attention import Attention
from ..layers.attention_options import Projections
from ..layers.mlp import DenseMLP, activation
from ..layers.moe import SwitchMLP, combine_experts, stack_experts
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d
from ..layers.step import resolve_offset
from .args import BaseModelArgs
from .deepseek_v3 import SigmoidGate
from .mamba2 import Mamba2Mixer, SSDDims

# hybrid_override_pattern letters (hub configs) -> layers_block_type names
_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_KINDS = {"linear_attention": "mamba", "conv": "mamba", "full_attention": "attention"}


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: Optional[int] = None
    layers_block_type: Optional[list] = None
    hybrid_override_pattern: Optional[str] = None
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: Optional[int] = None
    attention_bias: bool = False
    intermediate_size: int = 21504
    mlp_hidden_act: str = "relu2"
    mlp_bias: bool = False
    ssm_state_size: int = 128
    mamba_num_heads: int = 128
    mamba_head_dim: int = 64
    n_groups: int = 8
    conv_kernel: int = 4
    use_conv_bias: bool = True
    use_bias: bool = False
    time_step_min: float = 0.001
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 7688
    moe_shared_expert_intermediate_size: int = 7688
    moe_latent_size: Optional[int] = None
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = False
    max_position_embeddings: Optional[int] = None

    def __post_init__(self):
        if self.layers_block_type is None:
            if not self.hybrid_override_pattern:
                raise ValueError("nemotron_h config needs layers_block_type or hybrid_override_pattern")
            self.layers_block_type = [_PATTERN[c] for c in self.hybrid_override_pattern]
        self.layers_block_type = [_KINDS.get(k, k) for k in self.layers_block_type]
        letters = {kind: letter for letter, kind in _PATTERN.items()}
        unknown = sorted({k for k in self.layers_block_type if k not in letters})
        if unknown:
            raise ValueError(f"nemotron_h: unknown layers_block_type {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(letters) + sorted(_KINDS))})")
        # mlx-lm's field: one letter per layer, also when the config gave block types.
        self.hybrid_override_pattern = [letters[k] for k in self.layers_block_type]
        self.num_hidden_layers = len(self.layers_block_type)
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads


class NemotronMoE(nn.Module):
    """Sigmoid-routed ReLU² experts (``switch_mlp``: ``up_proj``/``down_proj``) plus an
    always-on ``shared_experts`` MLP, with optional latent projections around the
    experts."""

    def __init__(self, args):
        super().__init__()
        act = activation(args.mlp_hidden_act)
        dims = args.moe_latent_size or args.hidden_size
        self.gate = SigmoidGate(args)
        self.switch_mlp = SwitchMLP(dims, args.moe_intermediate_size, args.n_routed_experts, act,
                                    bias=args.mlp_bias)
        self.shared_experts = DenseMLP(args.hidden_size, args.moe_shared_expert_intermediate_size,
                                       act, bias=args.mlp_bias)
        if args.moe_latent_size:
            self.fc1_latent_proj = nn.Linear(args.hidden_size, dims, bias=args.mlp_bias)
            self.fc2_latent_proj = nn.Linear(dims, args.hidden_size, bias=args.mlp_bias)


    def __call__(self, x):
        indices, weights = self.gate(x)
        h = self.fc1_latent_proj(x) if "fc1_latent_proj" in self else x
        y = combine_experts(self.switch_mlp(h, indices), weights, x.dtype)
        if "fc2_latent_proj" in self:
            y = self.fc2_latent_proj(y)
        return y + self.shared_experts(x)


class Block(nn.Module):
    def __init__(self, args, kind):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(args.hidden_size, args.layer_norm_epsilon)
        if kind == "mamba":
            dims = SSDDims(args.mamba_num_heads, args.mamba_head_dim, args.ssm_state_size,
                           args.n_groups, args.conv_kernel)
            self.mixer = Mamba2Mixer(args.hidden_size, dims, args.layer_norm_epsilon,
                                     args.use_bias, args.use_conv_bias,
                                     (args.time_step_min, float("inf")))
        elif kind == "attention":
            self.mixer = Attention(args.hidden_size, args.num_attention_heads,
                                   args.num_key_value_heads, args.head_dim, None,
                                   projections=Projections(bias=args.attention_bias))
        elif kind == "mlp":
            self.mixer = DenseMLP(args.hidden_size, args.intermediate_size,
                                  activation(args.mlp_hidden_act), bias=args.mlp_bias)
        elif kind == "moe":
            self.mixer = NemotronMoE(args)
        else:
            raise ValueError(f"unknown nemotron_h block type '{kind}'")

    def __call__(self, x, mask, offset, cache):
        h = self.norm(x)
        if self.kind in ("mamba", "attention"):
            return x + self.mixer(h, mask, offset, cache)
        return x + self.mixer(h)


class Backbone(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [Block(args, kind) for kind in args.layers_block_type]
        self.norm_f = RMSNorm(args.hidden_size, args.layer_norm_epsilon)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.backbone = Backbone(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        # Layer i's cache is cache[slot[i]]; MLP/MoE blocks have none.
        kinds = args.layers_block_type
        cached = [i for i, k in enumerate(kinds) if k in ("mamba", "attention")]
        self.cache_slot = {i: n for n, i in enumerate(cached)}
        attn = [n for n, i in enumerate(cached) if kinds[i] == "attention"]
        self.attention_slot = attn[0] if attn else None

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 **unused):
        offset = resolve_offset(inputs, offset, cache)
        L = inputs.shape[1]
        if mask is None and self.attention_slot is not None:
            # One mask for every attention layer: their caches share one layout.
            caches = None if cache is None else [cache[self.attention_slot]]
            mask = masks_lib.masks_for_layers(caches, [None], L, offset)[0]
        h = self.backbone.embeddings(inputs) if input_embeddings is None else input_embeddings
        for i, layer in enumerate(self.layers):
            slot = self.cache_slot.get(i)
            c = None if cache is None or slot is None else cache[slot]
            h = layer(h, mask, offset, c)
        h = self.backbone.norm_f(h)
        if "lm_head" in self:
            return self.lm_head(h)
        return self.backbone.embeddings.as_linear(h)

    @property
    def layers(self):
        return self.backbone.layers

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per Mamba-2 block, a key/value cache per attention block."""
        return [StateCache(2) if k == "mamba"
                else KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size)
                for k in self.args.layers_block_type if k in ("mamba", "attention")]

    def sanitize(self, weights):
        out = {}
        for name, w in weights.items():
            if name.endswith("conv1d.weight"):
                w = CausalConv1d.sanitize_weight(w, self.args.conv_kernel)
            out[name] = w
        if self.args.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        for i, kind in enumerate(self.args.layers_block_type):
            if kind == "moe":
                stack_experts(out, f"backbone.layers.{i}.mixer", self.args.n_routed_experts,
                              names={"up_proj": "fc1", "down_proj": "fc2"})
        return out
