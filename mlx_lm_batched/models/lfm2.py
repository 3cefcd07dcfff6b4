"""LFM2: a hybrid of gated short-convolution layers (``StateCache``) and GQA attention
layers with QK-norm (``KVCache``), each followed by a SwiGLU MLP."""

from dataclasses import dataclass
from typing import Optional

from ..cache.kv import KVCache
from ..cache.rotating import RotatingKVCache
from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.attention_options import QKNorm
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.ssm import CausalConv1d, HybridBlock, ShortConv
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm

# Hugging Face names -> the shared layers' names.
_RENAMES = (("self_attn.out_proj.", "self_attn.o_proj."), ("feed_forward.w1.", "feed_forward.gate_proj."),
            ("feed_forward.w3.", "feed_forward.up_proj."), ("feed_forward.w2.", "feed_forward.down_proj."),
            ("model.embedding_norm.", "model.norm."))


@dataclass
class ModelArgs(DecoderArgs):
    intermediate_size: Optional[int] = None  # or mlx-lm's block_ff_dim
    block_ff_dim: Optional[int] = None
    block_dim: Optional[int] = None  # mlx-lm's name of hidden_size
    norm_eps: float = 1e-5
    conv_bias: bool = False
    conv_L_cache: int = 3
    block_multiple_of: int = 256
    block_ffn_dim_multiplier: Optional[float] = 1.0
    block_auto_adjust_ff_dim: bool = True
    layer_types: Optional[list] = None
    full_attn_idxs: Optional[list] = None
    tie_word_embeddings: bool = True

    def __post_init__(self):
        # transformers reads intermediate_size; mlx-lm's block_ff_dim fills in for it.
        self.intermediate_size = self.intermediate_size or self.block_ff_dim
        self.block_ff_dim = self.block_ff_dim or self.intermediate_size  # mlx-lm's name
        if self.intermediate_size is None:
            raise ValueError(f"{self.model_type}: intermediate_size (or block_ff_dim) is required")
        if self.block_dim not in (None, self.hidden_size):
            raise ValueError(f"{self.model_type}: block_dim={self.block_dim} must equal "
                             f"hidden_size={self.hidden_size}")
        super().__post_init__()
        if self.layer_types is None:
            full = set(self.full_attn_idxs if self.full_attn_idxs is not None
                       else range(self.num_hidden_layers))
            self.layer_types = ["full_attention" if i in full else "conv"
                                for i in range(self.num_hidden_layers)]

    def ff_dim(self):
        """The MLP width after LFM2's automatic adjustment."""
        n = self.intermediate_size
        if self.block_auto_adjust_ff_dim:
            n = int(2 * n / 3)
            if self.block_ffn_dim_multiplier is not None:
                n = int(self.block_ffn_dim_multiplier * n)
                m = self.block_multiple_of
                n = m * ((n + m - 1) // m)
        return n


class Model(CausalLM):
    def __init__(self, args: ModelArgs, feed_forward=None):
        """``feed_forward(i)``: layer ``i``'s MLP (LFM2-MoE's); default LFM2's SwiGLU."""
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.norm_eps)
        names = lambda mixer: (mixer, "feed_forward", "operator_norm", "ffn_norm")
        layers = []
        for i, kind in enumerate(args.layer_types):
            mlp = feed_forward(i) if feed_forward else MLP(args.hidden_size, args.ff_dim())
            if kind == "conv":
                mixer = ShortConv(args.hidden_size, args.conv_L_cache, args.conv_bias)
                layers.append(HybridBlock(mixer, mlp, norm, names("conv")))
            else:
                mixer = Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                                  qk_norm=QKNorm(lambda d: RMSNorm(d, args.norm_eps),
                                                 names=("q_layernorm", "k_layernorm")))
                layers.append(HybridBlock(mixer, mlp, norm, names("self_attn")))
        init_causal_lm(self, args, layers, norm())

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per conv layer, a key/value cache per attention layer."""
        return [StateCache(1) if kind == "conv"
                else KVCache() if max_kv_size is None else RotatingKVCache(max_kv_size)
                for kind in self.args.layer_types]

    def sanitize(self, weights):
        out = {}
        for name, w in super().sanitize(weights).items():
            for old, new in _RENAMES:
                name = name.replace(old, new)
            if name.endswith("conv.conv.weight"):
                w = CausalConv1d.sanitize_weight(w, self.args.conv_L_cache)
            out[name] = w
        return out
