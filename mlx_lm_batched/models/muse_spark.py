"""Muse Spark (Meta; the language model of its multimodal checkpoint, text input only:
the vision and audio towers are ignored). Muse Glimmer's attention (weightless
QK-norm, queries times ``qk_scale_factor``, NoPE on every 4th layer from the last,
sliding elsewhere) with a weightless RMS norm on each head's output before its
sigmoid gate; sandwich blocks whose residual adds are *gated*
(``alpha * stream + beta * branch`` from a fixed per-feature gate); and a
mixture of experts run at a compressed width (``moe_hidden_size``): a sigmoid router
with a choice bias, ``pre_expert_proj`` and a norm before the experts, an
input-scaled norm on each expert's output, ``post_expert_proj`` after."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import OutputGatedAttention
from ..layers.attention_options import QKNorm, Scores
from ..layers.mlp import MLP
from ..layers.moe import SwitchGLU, combine_experts, softmax_topk, stack_experts
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, config_rope, init_causal_lm, type_windows
from .multimodal import TextConfigArgs, accepts_text_config, check_text_model_type, language_model_weights
from .muse_glimmer import NormedEmbeddingStack

# Added to the sum of the top-k router weights before they are normalised.
ROUTER_NORM_EPS = 1e-15
# Bounds the residual gate's stream weight away from 0.
RESIDUAL_GATE_EPS = 1e-3


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, DecoderArgs):
    vocab_size: int = 202048
    intermediate_size: int = 16384  # transformers' MuseSparkTextConfig default (dense layers)
    num_key_value_heads: Optional[int] = 16
    head_dim: Optional[int] = 64
    max_position_embeddings: Optional[int] = 1048576
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    post_norm_eps: float = 1e-8
    sliding_window: Optional[int] = 2048
    layer_types: Optional[List[str]] = None
    layer_rope_theta: Optional[List[float]] = None
    mlp_layer_types: Optional[List[str]] = None
    qk_scale_factor: float = 5.4730064863875
    hidden_act: str = "silu"
    final_logit_softcapping: float = 20.0
    output_multiplier: float = 0.1767766952966369
    residual_gate_temperature: float = 0.3
    num_local_experts: int = 256
    num_experts_per_tok: int = 8
    moe_hidden_size: int = 4096
    moe_intermediate_size: int = 4096
    routed_scaling_factor: float = 1.0
    num_shared_experts: int = 0
    text_model_type: Optional[str] = None

    @property
    def text(self):
        """mlx-lm's nested text args: the text fields are these args' own."""
        return self

    def __post_init__(self):
        super().__post_init__()
        check_text_model_type(self, ("muse_spark_text",))
        if self.num_shared_experts:
            raise NotImplementedError("muse_spark: num_shared_experts > 0 is not supported "
                                      "(the released checkpoints have none)")
        n = self.num_hidden_layers
        if self.layer_types is None:
            self.layer_types = ["full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention"
                                for i in range(n)]
        if self.layer_rope_theta is None:
            self.layer_rope_theta = [0 if (n - 1 - i) % 4 == 0 else self.rope_theta
                                     for i in range(n)]
        if self.mlp_layer_types is None:
            self.mlp_layer_types = ["sparse"] * n
        bad = sorted(set(self.mlp_layer_types) - {"sparse", "dense"})
        if bad:
            raise ValueError(f"muse_spark: unknown mlp_layer_types {bad} (known: dense, sparse)")


class HeadNormedGatedAttention(OutputGatedAttention):
    """The sigmoid-gated attention with each head's output RMS-normed (no weight)
    before the gate."""

    def __init__(self, *args, head_norm_eps, **kwargs):
        super().__init__(*args, **kwargs)
        self.head_norm_eps = head_norm_eps

    def head_outputs(self, out):
        return mx.fast.rms_norm(out, None, self.head_norm_eps)


class InputScaledRMSNorm(nn.Module):
    """``rms_norm(x * (1 + w))``: the gain scales the input, not the output (so it
    only matters through its shape across features)."""

    def __init__(self, dims, eps):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x):
        return mx.fast.rms_norm(x * (1.0 + self.weight), None, self.eps)


class ResidualGate(nn.Module):
    """``alpha * stream + beta * branch`` with ``beta = sigmoid(g / T)`` and
    ``alpha = sqrt(max(sigmoid(-g / T) * (1 + beta), eps))`` per feature, computed in
    float32 from the fixed gate ``g``."""

    def __init__(self, dims, temperature):
        super().__init__()
        self.gate = mx.zeros((dims,))
        self.temperature = temperature

    def __call__(self, stream, branch):
        w = self.gate.astype(mx.float32) / self.temperature
        beta = mx.sigmoid(w)
        alpha = mx.sqrt(mx.maximum(mx.sigmoid(-w) * (1.0 + beta), RESIDUAL_GATE_EPS))
        return (alpha * stream + beta * branch).astype(stream.dtype)


class CompressedMoE(nn.Module):
    """Experts at a compressed width: ``post_expert_proj(sum_k w_k *
    post_norm(expert_k(pre_norm(pre_expert_proj(x)))))``. The router (``gate``)
    scores experts by ``sigmoid(output_multiplier * logits)`` in float32, chooses with
    ``e_score_correction_bias`` added, and normalises the k chosen scores."""

    def __init__(self, args):
        super().__init__()
        h, c, e = args.hidden_size, args.moe_hidden_size, args.num_local_experts
        self.gate = nn.Linear(h, e, bias=False)
        self.e_score_correction_bias = mx.zeros((e,))
        self.pre_expert_proj = nn.Linear(h, c, bias=False)
        self.pre_expert_norm = RMSNorm(c, args.rms_norm_eps, zero_centered=True)
        self.experts = SwitchGLU(c, args.moe_intermediate_size, e, "silu")
        self.post_expert_norm = InputScaledRMSNorm(c, args.post_norm_eps)
        self.post_expert_proj = nn.Linear(c, h, bias=False)
        self.top_k = args.num_experts_per_tok
        self.logit_scale = args.output_multiplier
        self.route_scale = args.routed_scaling_factor

    def route(self, x):
        logits = x.astype(mx.float32) @ self.gate.weight.astype(mx.float32).T
        indices, weights = softmax_topk(logits * self.logit_scale, self.top_k, sigmoid=True,
                                        choice_bias=self.e_score_correction_bias)
        weights = weights / (weights.sum(axis=-1, keepdims=True) + ROUTER_NORM_EPS)
        return indices, weights * self.route_scale

    def __call__(self, x):
        indices, weights = self.route(x)
        h = self.pre_expert_norm(self.pre_expert_proj(x))
        y = self.post_expert_norm(self.experts(h, indices))
        return self.post_expert_proj(combine_experts(y, weights, h.dtype))


class GatedResidualBlock(nn.Module):
    """Norms before and after attention and the MLP (as Gemma 2's sandwich), each
    branch joining the stream through a :class:`ResidualGate`."""

    def __init__(self, args, attn, mlp):
        super().__init__()
        dims, eps, post_eps = args.hidden_size, args.rms_norm_eps, args.post_norm_eps
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(dims, eps, zero_centered=True)
        self.post_attention_layernorm = RMSNorm(dims, post_eps, affine=False)
        self.pre_feedforward_layernorm = RMSNorm(dims, eps, zero_centered=True)
        self.post_feedforward_layernorm = InputScaledRMSNorm(dims, post_eps)
        t = args.residual_gate_temperature
        self.post_attention_residual_gate = ResidualGate(dims, t)
        self.post_feedforward_residual_gate = ResidualGate(dims, t)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        r = self.self_attn(self.input_layernorm(x), mask, offset, cache, attention)
        h = self.post_attention_residual_gate(x, self.post_attention_layernorm(r))
        r = self.mlp(self.pre_feedforward_layernorm(h))
        return self.post_feedforward_residual_gate(h, self.post_feedforward_layernorm(r))


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        head_norm = lambda dims: RMSNorm(dims, args.rms_norm_eps, affine=False)
        # Weightless QK-norm, queries times qk_scale_factor: a factor on the logits.
        scale = args.head_dim**-0.5 * args.qk_scale_factor

        def feed_forward(kind):
            if kind == "dense":
                return MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
            return CompressedMoE(args)

        layers = [
            GatedResidualBlock(
                args,
                HeadNormedGatedAttention(args.hidden_size, args.num_attention_heads,
                                         args.num_key_value_heads, args.head_dim,
                                         rope if theta else None, head_norm_eps=args.rms_norm_eps,
                                         qk_norm=QKNorm(head_norm), scores=Scores(scale=scale)),
                feed_forward(kind),
            )
            for theta, kind in zip(args.layer_rope_theta, args.mlp_layer_types)
        ]
        init_causal_lm(self, args, layers, RMSNorm(args.hidden_size, args.rms_norm_eps),
                       type_windows(args.layer_types, args.sliding_window))
        self.model = NormedEmbeddingStack(args.vocab_size, args.hidden_size, layers,
                                          self.model.norm, embed_eps=args.rms_norm_eps)
        self.logit_scale = args.output_multiplier
        self.final_logit_softcap = args.final_logit_softcapping

    def sanitize(self, weights):
        weights = {k: v for k, v in weights.items()
                   if not any(part.startswith("vision_") for part in k.split("."))}
        weights = language_model_weights(weights)
        for i, kind in enumerate(self.args.mlp_layer_types):
            prefix = f"model.layers.{i}.mlp"
            if kind != "sparse":
                continue
            # The checkpoint keeps the router's bias under the gate and the
            # post-expert norm under the experts.
            for src, dst in (("gate.e_score_correction_bias", "e_score_correction_bias"),
                             ("experts.post_expert_norm.weight", "post_expert_norm.weight")):
                if f"{prefix}.{src}" in weights:
                    weights[f"{prefix}.{dst}"] = weights.pop(f"{prefix}.{src}")
            stack_experts(weights, prefix, self.args.num_local_experts, dst="experts")
        return super().sanitize(weights)
