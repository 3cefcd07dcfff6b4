"""Kimi K3 (Moonshot): Kimi Linear's hybrid of Kimi delta attention and RoPE-free
latent attention, with

- the SiTU activation ``beta * tanh(g / beta) * sigmoid(g) * u`` (``u`` optionally
  soft-clipped to ``linear_beta * tanh(u / linear_beta)``) in every MLP and expert;
- *attention residuals* (``attn_res_block_size``): the stream entering attention, the
  MLP and the final norm is a softmax mix, over depth, of the outputs saved at each
  block start and the running partial sum; each mix scores its inputs by a learned
  ``res_proj(res_norm(.))`` (one logit per token, so padding stays exact);
- a latent MoE (``routed_expert_hidden_size``): experts run on a down-projected
  stream, optionally normed, then projected back;
- optional full-rank KDA output gates, lower-bounded KDA decay and per-feature
  latent-attention output gates.

A multimodal checkpoint's language model loads the same way (``text_config``, a
``language_model.`` prefix); image input is not supported."""

from dataclasses import dataclass
from functools import partial
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.gated_delta import KimiDeltaAttention
from ..layers.mla import LatentDims, MultiHeadLatentAttention, merge_absorbed_kv_b
from ..layers.mlp import MLP
from ..layers.moe import SwitchGLU, combine_experts
from ..layers.norms import RMSNorm
from ..layers.stack import DecoderStack
from . import kimi_linear
from .deepseek_v3 import SigmoidGate
from .multimodal import TextConfigArgs, accepts_text_config, language_model_weights


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, kimi_linear.ModelArgs):
    """Kimi K3's config: Kimi Linear's fields (mlx-lm 0.32's defaults where they
    differ) and K3's own. KDA layers are ``linear_attn_config["kda_layers"]``
    (1-indexed); the others use latent attention."""

    hidden_act: str = "situ"
    activation_situ_beta: Optional[float] = None
    activation_situ_linear_beta: Optional[float] = None
    attn_res_block_size: Optional[int] = None
    mla_use_nope: bool = True
    mla_use_output_gate: bool = False
    routed_expert_hidden_size: Optional[int] = None
    latent_moe_use_norm: bool = False
    moe_layer_freq: int = 1
    moe_router_activation_func: str = "sigmoid"
    first_k_dense_replace: int = 0
    num_shared_experts: int = 0
    num_experts_per_token: int = 16
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        if self.hidden_act != "situ":
            raise ValueError(f"kimi_k3: hidden_act '{self.hidden_act}' is not supported "
                             "(only 'situ')")
        if self.moe_router_activation_func != "sigmoid":
            raise ValueError(f"kimi_k3: moe_router_activation_func "
                             f"'{self.moe_router_activation_func}' is not supported "
                             "(only 'sigmoid')")
        if not self.mla_use_nope:
            raise NotImplementedError("kimi_k3: latent attention with RoPE "
                                      "(mla_use_nope=false) is not supported")
        lac = self.linear_attn_config or {}
        n = self.num_hidden_layers
        if self.layer_types is None and "kda_layers" in lac:
            kda = set(lac["kda_layers"])
            self.layer_types = ["linear_attention" if i + 1 in kda else "full_attention"
                                for i in range(n)]
        if self.mlp_layer_types is None:
            self.mlp_layer_types = [
                "sparse" if self.num_experts and i >= self.first_k_dense_replace
                and i % self.moe_layer_freq == 0 else "dense" for i in range(n)]
        self.situ_beta = self.activation_situ_beta or 1.0
        super().__post_init__()


def situ(up, gate, beta, linear_beta):
    """SiTU in float32: ``beta * tanh(gate / beta) * sigmoid(gate)`` times ``up`` (soft-
    clipped to ``linear_beta * tanh(up / linear_beta)`` when given)."""
    dtype = up.dtype
    gate, up = gate.astype(mx.float32), up.astype(mx.float32)
    a = beta * mx.tanh(gate / beta) * mx.sigmoid(gate)
    if linear_beta is not None:
        up = linear_beta * mx.tanh(up / linear_beta)
    return (a * up).astype(dtype)


def situ_glu(gate, up, beta, linear_beta):
    """``situ`` in ``SwitchGLU``'s ``glu(gate, up)`` order; bound with ``functools.partial``
    (not a lambda) so the experts copy and pickle."""
    return situ(up, gate, beta, linear_beta)


class SiTUMLP(MLP):
    """The shared gated MLP (so it shards as one) with SiTU in place of ``act(g) * u``."""

    def __init__(self, hidden_size, intermediate_size, beta, linear_beta):
        super().__init__(hidden_size, intermediate_size)
        self.beta, self.linear_beta = beta, linear_beta

    def __call__(self, x):
        return self.down_proj(situ(self.up_proj(x), self.gate_proj(x), self.beta,
                                   self.linear_beta))


class LatentMoE(nn.Module):
    """DeepSeek V3's sigmoid router over SiTU experts that run on
    ``routed_expert_down_proj(x)`` (when ``routed_expert_hidden_size``), their weighted
    sum optionally RMS-normed and projected back up; plus shared experts."""

    def __init__(self, args):
        super().__init__()
        h, latent = args.hidden_size, args.routed_expert_hidden_size
        beta, lb = args.situ_beta, args.activation_situ_linear_beta
        self.gate = SigmoidGate(args)
        self.switch_mlp = SwitchGLU(latent or h, args.moe_intermediate_size, args.num_experts,
                                    glu=partial(situ_glu, beta=beta, linear_beta=lb))
        if latent is not None:
            self.routed_expert_down_proj = nn.Linear(h, latent, bias=False)
            self.routed_expert_up_proj = nn.Linear(latent, h, bias=False)
            if args.latent_moe_use_norm:
                self.routed_expert_norm = RMSNorm(latent, args.rms_norm_eps)
        if args.num_shared_experts:
            self.shared_experts = SiTUMLP(h, args.moe_intermediate_size * args.num_shared_experts,
                                          beta, lb)

    def __call__(self, x):
        indices, weights = self.gate(x)
        latent = "routed_expert_down_proj" in self
        y = self.routed_expert_down_proj(x) if latent else x
        y = combine_experts(self.switch_mlp(y, indices), weights, y.dtype)
        if "routed_expert_norm" in self:
            y = self.routed_expert_norm(y)
        if latent:
            y = self.routed_expert_up_proj(y)
        if "shared_experts" in self:
            y = y + self.shared_experts(x)
        return y


def depth_mix(saved, partial, proj, norm):
    """The attention-residual mix: softmax over ``saved + [partial]`` (each ``(B, L, D)``)
    of the per-token logits ``proj(norm(.))``, in float32; ``partial`` alone when nothing
    is saved yet."""
    if not saved:
        return partial
    inputs = saved + [partial]
    logits = mx.concatenate([proj(norm(t.astype(mx.float32))) for t in inputs], axis=-1)
    p = mx.softmax(logits, axis=-1, precise=True)
    out = sum(p[..., i:i + 1] * t.astype(mx.float32) for i, t in enumerate(inputs))
    return out.astype(partial.dtype)


class AttnResBlock(nn.Module):
    """Kimi K3's decoder layer. Without attention residuals it is the pre-norm block;
    with them, the layer carries the *partial sum* of its block's branch outputs and
    reads, for attention and the MLP, the depth mix of the ``saved`` block outputs and
    that partial sum. A block's first layer saves its incoming sum (appended to
    ``saved``, the list the stack passes down) and starts a new one."""

    def __init__(self, args, mixer, mlp, block_start):
        super().__init__()
        dims, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn, self.mlp = mixer, mlp
        self.input_layernorm = RMSNorm(dims, eps)
        self.post_attention_layernorm = RMSNorm(dims, eps)
        self.use_attn_res = args.attn_res_block_size is not None
        self.block_start = block_start
        if self.use_attn_res:
            self.self_attention_res_proj = nn.Linear(dims, 1, bias=False)
            self.self_attention_res_norm = RMSNorm(dims, eps)
            self.mlp_res_proj = nn.Linear(dims, 1, bias=False)
            self.mlp_res_norm = RMSNorm(dims, eps)

    def __call__(self, x, mask, offset, cache, attention, saved):
        if not self.use_attn_res:
            h = x + self.self_attn(self.input_layernorm(x), mask, offset, cache, attention)
            return h + self.mlp(self.post_attention_layernorm(h))
        h = depth_mix(saved, x, self.self_attention_res_proj, self.self_attention_res_norm)
        partial = x
        if self.block_start:
            saved.append(x)
            partial = None
        y = self.self_attn(self.input_layernorm(h), mask, offset, cache, attention)
        partial = y if partial is None else partial + y
        h = depth_mix(saved, partial, self.mlp_res_proj, self.mlp_res_norm)
        return partial + self.mlp(self.post_attention_layernorm(h))


class AttnResStack(DecoderStack):
    """The decoder stack that threads the saved block outputs through its layers and
    mixes them into the final norm's input (``output_attn_res_*``)."""

    def __init__(self, args, layers, norm):
        super().__init__(args.vocab_size, args.hidden_size, layers, norm)
        if args.attn_res_block_size is not None:
            self.output_attn_res_proj = nn.Linear(args.hidden_size, 1, bias=False)
            self.output_attn_res_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        cache = cache if cache is not None else [None] * len(self.layers)
        saved = []
        for layer, m, c in zip(self.layers, masks, cache):
            h = layer(h, m, offset, c, attention, saved)
        if "output_attn_res_proj" in self:
            h = depth_mix(saved, h, self.output_attn_res_proj, self.output_attn_res_norm)
        return self.norm(h)


class Model(kimi_linear.Model):
    """Kimi Linear's caches (a ``StateCache`` per KDA layer) and checkpoint mapping, with
    K3's own layers and stack (built here, not by Kimi Linear's constructor)."""

    def __init__(self, args: ModelArgs):
        nn.Module.__init__(self)
        lac = args.linear_attn_config or {}
        beta, lb = args.situ_beta, args.activation_situ_linear_beta
        layers = []
        for i, (kind, mlp_kind) in enumerate(zip(args.layer_types, args.mlp_layer_types)):
            if kind == "linear_attention":
                mixer = KimiDeltaAttention(args.hidden_size, args.linear_num_heads,
                                           args.linear_head_dim, args.linear_conv_kernel_dim,
                                           args.rms_norm_eps, lac.get("gate_lower_bound"),
                                           lac.get("use_full_rank_gate", False))
            else:
                mixer = MultiHeadLatentAttention(
                    args.hidden_size, args.num_attention_heads, LatentDims.from_args(args),
                    output_gate="feature" if args.mla_use_output_gate else False)
            mlp = (LatentMoE(args) if mlp_kind == "sparse"
                   else SiTUMLP(args.hidden_size, args.intermediate_size, beta, lb))
            block_start = args.attn_res_block_size is not None and i % args.attn_res_block_size == 0
            layers.append(AttnResBlock(args, mixer, mlp, block_start))
        self.args = args
        self.model_type = args.model_type
        self.model = AttnResStack(args, layers, RMSNorm(args.hidden_size, args.rms_norm_eps))
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = [None] * len(layers)

    def sanitize(self, weights):
        weights = {k: v for k, v in weights.items()
                   if not k.startswith(("model.mtp", "mtp", "vision_tower", "vision_model",
                                        "multi_modal_projector", "mm_projector"))}
        weights = language_model_weights(weights)
        renamed = {}
        for k, v in weights.items():
            # Moonshot's names for the attention-residual weights.
            for src in ("self_attention_res", "mlp_res", "output_attn_res"):
                k = k.replace(f"{src}.proj_weight", f"{src}_proj.weight")
                k = k.replace(f"{src}.norm_weight", f"{src}_norm.weight")
            if k.endswith("_res_proj.weight"):
                v = v.reshape(1, -1)  # one logit: a (1, hidden) projection
            renamed[k] = v
        weights = renamed
        args = self.args
        for i, kind in enumerate(args.layer_types):
            p = f"model.layers.{i}.self_attn."
            if kind == "linear_attention":
                # mlx-lm's converted layout: one fused q/k/v projection and convolution.
                qkv = weights.pop(p + "qkv_proj.weight", None)
                if qkv is not None:
                    for name, w in zip("qkv", mx.split(qkv, 3, axis=0)):
                        weights[p + f"{name}_proj.weight"] = w
                conv = weights.pop(p + "qkv_conv.conv.weight", None)
                if conv is not None:
                    weights[p + "conv1d.weight"] = conv
            else:
                merge_absorbed_kv_b(weights, p[:-1], args.qk_nope_head_dim, args.kv_lora_rank)
        weights = super().sanitize(weights)
        for i, kind in enumerate(args.layer_types):
            fg = f"model.layers.{i}.self_attn.forget_gate."
            for name, shape in (("A_log", (1, 1, -1, 1)), ("dt_bias", (-1,))):
                if fg + name in weights:  # mlx-lm keeps them flat, Moonshot per head
                    weights[fg + name] = weights[fg + name].reshape(shape)
            # mlx-lm keeps the router's bias beside the router.
            m = f"model.layers.{i}.mlp."
            if m + "e_score_correction_bias" in weights:
                weights[m + "gate.e_score_correction_bias"] = weights.pop(
                    m + "e_score_correction_bias")
        return weights
