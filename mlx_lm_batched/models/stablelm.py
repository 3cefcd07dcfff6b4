"""StableLM (2, Zephyr, 3B-4E1T): llama attention and gated MLP with biased
LayerNorms, partial rotary, optional q/k/v bias, optional per-head QK LayerNorm and
an optional parallel residual (one norm feeding attention and MLP)."""

import re
from dataclasses import dataclass

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import ParallelBlock, PreNormBlock
from ..layers.mlp import MLP
from ..layers.norms import HeadwiseLayerNorm, LayerNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    layer_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    partial_rotary_factor: float = 0.25
    use_qkv_bias: bool = False
    qk_layernorm: bool = False
    use_parallel_residual: bool = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, int(head_dim * args.partial_rotary_factor))
        norm = lambda: LayerNorm(args.hidden_size, args.layer_norm_eps)
        qk_norm = None
        if args.qk_layernorm:  # one bias-free LayerNorm per head, fed the whole projection
            eps = args.layer_norm_eps
            qk_norm = QKNorm(lambda dims: HeadwiseLayerNorm(dims // head_dim, head_dim, eps),
                             full=True, names=("q_layernorm", "k_layernorm"))
        layers = []
        for _ in range(args.num_hidden_layers):
            attn = Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                             qk_norm=qk_norm,
                             projections=Projections(bias=args.use_qkv_bias, o_bias=False))
            mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
            if args.use_parallel_residual:
                layers.append(ParallelBlock(attn, mlp, norm, norm_names=("input_layernorm",)))
            else:
                layers.append(PreNormBlock(attn, mlp, norm))
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        # Per-head QK norms ``*_layernorm.norms.{h}.weight`` -> one (heads, head_dim) weight.
        heads = {}
        out = {}
        for k, v in weights.items():
            m = re.match(r"(.*_layernorm)\.norms\.(\d+)\.weight$", k)
            if m:
                heads.setdefault(m.group(1), {})[int(m.group(2))] = v
            else:
                out[k] = v
        for prefix, per_head in heads.items():
            out[f"{prefix}.weight"] = mx.stack([per_head[i] for i in range(len(per_head))])
        return super().sanitize(out)
