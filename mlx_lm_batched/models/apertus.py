"""Apertus (Swiss AI): llama-style pre-norm blocks (norms named
``attention_layernorm``/``feedforward_layernorm``), per-head RMS QK-norm, llama3
RoPE, and an ungated ``up_proj``/``down_proj`` MLP with the learned xIELU activation."""

import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import activation
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm

XIELU_DEFAULTS = {"beta": 0.5, "eps": -1e-6}


class XIELU(nn.Module):
    """xIELU (arXiv 2411.13010): quadratic for positive inputs, an ELU-like
    expm1 branch for negative ones; ``alpha_p``/``alpha_n`` are learned through
    softplus, ``beta``/``eps`` are fixed scalars stored with the checkpoint."""

    def __init__(self):
        super().__init__()
        self.alpha_p = mx.zeros((1,))
        self.alpha_n = mx.zeros((1,))
        self.beta = mx.array(XIELU_DEFAULTS["beta"])
        self.eps = mx.array(XIELU_DEFAULTS["eps"])

    def __call__(self, x):
        beta = self.beta.astype(x.dtype)
        alpha_p = nn.softplus(self.alpha_p).astype(x.dtype)
        alpha_n = beta + nn.softplus(self.alpha_n).astype(x.dtype)
        negative = (mx.expm1(mx.minimum(x, self.eps.astype(x.dtype))) - x) * alpha_n
        return mx.where(x > 0, alpha_p * x * x, negative) + beta * x


class ApertusMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, act):
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        # HF names the activation ``act_fn``; xIELU carries parameters there.
        self.act_fn = XIELU() if act == "xielu" else None
        self._act = None if act == "xielu" else activation(act)

    def __call__(self, x):
        h = self.up_proj(x)
        return self.down_proj(self.act_fn(h) if self._act is None else self._act(h))


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-5
    rope_theta: float = 12_000_000.0
    hidden_act: str = "xielu"
    attention_bias: bool = False


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                          qk_norm=QKNorm(norm), projections=Projections(bias=args.attention_bias)),
                ApertusMLP(args.hidden_size, args.intermediate_size, args.hidden_act),
                norm,
                norm_names=("attention_layernorm", "feedforward_layernorm"),
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        # xIELU scalars: alphas as (1,), beta/eps as 0-d; fill beta/eps if absent.
        prefixes = set()
        for k in list(weights):
            m = re.match(r"(.*\.act_fn)\.(alpha_p|alpha_n|beta|eps)$", k)
            if m:
                prefixes.add(m.group(1))
                shape = (1,) if m.group(2).startswith("alpha") else ()
                weights[k] = weights[k].reshape(shape)
        for p in prefixes:
            for name, value in XIELU_DEFAULTS.items():
                weights.setdefault(f"{p}.{name}", mx.array(value))
        return weights
