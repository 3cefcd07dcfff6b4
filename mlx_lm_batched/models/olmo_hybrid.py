"""OLMo hybrid (OLMo 3.x hybrid): gated delta-rule linear attention (``StateCache``) in
pre-norm blocks, and OLMo 2's post-norm full-attention blocks (``KVCache``), every
fourth layer unless ``layer_types`` says.

Released checkpoints have no RoPE (``rope_parameters`` null): the full-attention layers
are then position-free (NoPE), as in transformers. The linear layers allow negative
eigenvalues (``beta = 2 * sigmoid(b)``) unless ``linear_allow_neg_eigval`` is false.
Their checkpoint layout (separate ``q/k/v_proj``, ``q/k/v_conv1d`` as released or one
fused ``conv1d`` as transformers holds it, ``g_proj``, ``o_norm``; block norms
``attention_layer_norm``/``feedforward_layer_norm`` as released) is mapped at load onto the shared
``GatedDeltaNet``'s (``in_proj_qkv``, ``conv1d``, ``in_proj_z``, ``norm``)."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import SandwichBlock
from ..layers.gated_delta import DeltaHeads, GatedDeltaNet
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d, HybridBlock
from ..layers.stack import CausalLM
from .common import config_rope, init_causal_lm
from .olmo2 import POST_NORMS
from .olmo2 import ModelArgs as Olmo2Args

# checkpoint name -> the shared GatedDeltaNet's, inside ``linear_attn``
RENAMES = {"g_proj": "in_proj_z", "a_proj": "in_proj_a", "b_proj": "in_proj_b",
           "o_proj": "out_proj", "o_norm": "norm"}
SUFFIXES = ("weight", "scales", "biases")
# The released checkpoints' block norm names (transformers renames them the same way).
NORM_RENAMES = {".attention_layer_norm.": ".input_layernorm.",
                ".feedforward_layer_norm.": ".post_attention_layernorm."}


@dataclass
class ModelArgs(Olmo2Args):
    rope_theta: Optional[float] = None  # None: no RoPE (the released checkpoints)
    layer_types: Optional[List[str]] = None
    linear_num_key_heads: Optional[int] = None
    linear_num_value_heads: Optional[int] = None
    linear_key_head_dim: Optional[int] = None
    linear_value_head_dim: Optional[int] = None
    linear_conv_kernel_dim: int = 4
    linear_allow_neg_eigval: bool = True
    layer_norm_epsilon: float = 1e-5  # the linear layers' output norm

    def __post_init__(self):
        super().__post_init__()
        # transformers' OlmoHybridConfig defaults.
        if self.layer_types is None:
            n = self.num_hidden_layers
            self.layer_types = ["full_attention" if i % 4 == 3 else "linear_attention"
                                for i in range(n)]
            if "full_attention" not in self.layer_types:
                self.layer_types[-1] = "full_attention"
        self.linear_num_key_heads = self.linear_num_key_heads or self.num_attention_heads
        self.linear_num_value_heads = self.linear_num_value_heads or self.num_attention_heads
        self.linear_key_head_dim = (self.linear_key_head_dim or
                                    int(0.75 * self.hidden_size / self.linear_num_key_heads))
        self.linear_value_head_dim = self.linear_value_head_dim or 2 * self.linear_key_head_dim


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        rope = None if args.rope_theta is None else config_rope(args, args.head_dim)
        layers = []
        for kind in args.layer_types:
            mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
            if kind == "linear_attention":
                heads = DeltaHeads(args.linear_num_key_heads, args.linear_num_value_heads,
                                   args.linear_key_head_dim, args.linear_value_head_dim)
                mixer = GatedDeltaNet(args.hidden_size, heads, args.linear_conv_kernel_dim,
                                      args.layer_norm_epsilon, fused=False,
                                      beta_scale=2.0 if args.linear_allow_neg_eigval else 1.0)
                layers.append(HybridBlock(mixer, mlp, norm, ("linear_attn", "mlp",
                                                             "input_layernorm",
                                                             "post_attention_layernorm")))
            else:
                attn = Attention(args.hidden_size, args.num_attention_heads,
                                 args.num_key_value_heads, args.head_dim, rope,
                                 qk_norm=QKNorm(norm, full=True),
                                 projections=Projections(bias=args.attention_bias))
                layers.append(SandwichBlock(attn, mlp, norm, norm_names=POST_NORMS))
        init_causal_lm(self, args, layers, norm())

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per linear layer, a key/value cache per full one."""
        return [StateCache(2) if kind == "linear_attention"
                else KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size)
                for kind in self.args.layer_types]

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        for name in list(weights):
            for old, new in NORM_RENAMES.items():
                if old in name:
                    weights[name.replace(old, new)] = weights.pop(name)
        for i, kind in enumerate(self.args.layer_types):
            if kind == "linear_attention":
                _to_gated_delta_net(weights, f"model.layers.{i}.linear_attn.",
                                    self.args.linear_conv_kernel_dim)
        return weights


def _to_gated_delta_net(weights, prefix, kernel):
    """Map one linear layer's checkpoint names onto ``GatedDeltaNet``'s, in place."""
    for suffix in SUFFIXES:
        parts = [weights.pop(f"{prefix}{p}_proj.{suffix}", None) for p in "qkv"]
        if all(p is not None for p in parts):
            weights[f"{prefix}in_proj_qkv.{suffix}"] = mx.concatenate(parts, axis=0)
    convs = [weights.pop(f"{prefix}{p}_conv1d.weight", None) for p in "qkv"]
    if all(c is not None for c in convs):  # mlx-lm's three convolutions, (C, K, 1)
        weights[f"{prefix}conv1d.weight"] = mx.concatenate(convs, axis=0)
    if f"{prefix}conv1d.weight" in weights:
        weights[f"{prefix}conv1d.weight"] = CausalConv1d.sanitize_weight(
            weights[f"{prefix}conv1d.weight"], kernel)
    for name in list(weights):
        if not name.startswith(prefix):
            continue
        head, _, rest = name[len(prefix):].partition(".")
        if head in RENAMES:
            weights[f"{prefix}{RENAMES[head]}.{rest}"] = weights.pop(name)
