"""Hunyuan (v1, dense): llama blocks with per-head RMS QK-norm applied *after* RoPE
(``query_layernorm``/``key_layernorm``), and "dynamic" RoPE that, given a fixed
``alpha``, only stretches the base: ``theta * alpha ** (d / (d - 2))``."""

from dataclasses import dataclass

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    use_qk_norm: bool = True  # transformers-4 era configs; transformers 5 always norms


def hunyuan_rope(dims, args):
    scaling = args.rope_scaling or {}
    if scaling.get("alpha"):  # NTK-alpha: a fixed larger base, independent of length
        base = args.rope_theta * scaling["alpha"] ** (dims / (dims - 2))
        return make_rope(dims, base)
    return config_rope(args, dims)


class Model(CausalLM):
    def __init__(self, args: ModelArgs, make_mlp=None, make_attention=None):
        """``make_mlp(i)``: layer ``i``'s MLP (Hunyuan MoE: routed plus shared experts);
        ``make_attention(i, *args, **kwargs)``: layer ``i``'s attention from the shared
        ``Attention`` arguments (Hunyuan's cross-layer attention)."""
        make_attention = make_attention or (lambda i, *a, **k: Attention(*a, **k))
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = hunyuan_rope(head_dim, args)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        qk_norm = (QKNorm(norm, after_rope=True, names=("query_layernorm", "key_layernorm"))
                   if args.use_qk_norm else None)
        layers = [
            PreNormBlock(
                make_attention(i, args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                               rope, qk_norm=qk_norm,
                               projections=Projections(bias=args.attention_bias)),
                make_mlp(i) if make_mlp else MLP(args.hidden_size, args.intermediate_size,
                                                 args.hidden_act),
                norm,
            )
            for i in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())
