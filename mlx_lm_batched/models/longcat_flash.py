"""LongCat-Flash (Meituan): each decoder layer holds two latent-attention sublayers
(DeepSeek V3's MLA, its low-rank query and latent scaled by ``sqrt(hidden / rank)``),
each followed by a dense MLP, plus a "shortcut" MoE read after the first attention
sublayer and added at the layer's end. The MoE router is a softmax over the routed
experts and ``zero_expert_num`` zero-compute experts (identity), its choice biased
by ``e_score_correction_bias``, weights times ``routed_scaling_factor``.

Each sublayer has its own cache: the model has ``2 * num_layers`` caches and masks,
and the stack hands each decoder layer its pair."""

import math
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.mla import (LatentDims, MultiHeadLatentAttention, merge_absorbed_kv_b,
                          mla_softmax_scale)
from ..layers.mlp import MLP
from ..layers.moe import SwitchGLU, combine_experts, stack_experts, topk_indices
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM, DecoderStack
from .args import BaseModelArgs, require_values


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    vocab_size: int = 131072
    hidden_size: int = 6144
    num_layers: int = 28
    num_attention_heads: int = 64
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    attention_bias: bool = False
    norm_topk_prob: bool = False  # mlx-lm's field; renormalised top-k is not implemented
    ffn_hidden_size: int = 12288
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    moe_topk: int = 12
    n_routed_experts: int = 512
    zero_expert_num: Optional[int] = 256
    expert_ffn_hidden_size: int = 2048
    routed_scaling_factor: float = 6.0
    router_bias: bool = False
    mla_scale_q_lora: bool = True
    mla_scale_kv_lora: bool = True

    def __post_init__(self):
        require_values(self, norm_topk_prob=(False,))


class ScaledRMSNorm(RMSNorm):
    """RMS norm times a constant (LongCat's LoRA scales on MLA's latents: the
    projections after them are linear, so scaling here scales what they give)."""

    def __init__(self, dims, eps, scale):
        super().__init__(dims, eps)
        self.scale = scale

    def __call__(self, x):
        return super().__call__(x) * self.scale


def longcat_mla(args, rope, scale):
    attn = MultiHeadLatentAttention(
        args.hidden_size, args.num_attention_heads, LatentDims.from_args(args),
        rope, scale, args.attention_bias)
    if args.mla_scale_q_lora:
        attn.q_a_layernorm = ScaledRMSNorm(args.q_lora_rank, attn.q_a_layernorm.eps,
                                           math.sqrt(args.hidden_size / args.q_lora_rank))
    if args.mla_scale_kv_lora:
        attn.kv_a_layernorm = ScaledRMSNorm(args.kv_lora_rank, attn.kv_a_layernorm.eps,
                                            math.sqrt(args.hidden_size / args.kv_lora_rank))
    return attn


class Router(nn.Module):
    def __init__(self, args: ModelArgs, n_choices):
        super().__init__()
        self.classifier = nn.Linear(args.hidden_size, n_choices, bias=args.router_bias)
        self.e_score_correction_bias = mx.zeros((n_choices,))


class ZeroExpertMoE(nn.Module):
    """Top-k over routed experts and identity ("zero-compute") experts."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_routed = args.n_routed_experts
        self.top_k = args.moe_topk
        self.scaling = args.routed_scaling_factor
        self.router = Router(args, args.n_routed_experts + (args.zero_expert_num or 0))
        self.switch_mlp = SwitchGLU(args.hidden_size, args.expert_ffn_hidden_size,
                                    args.n_routed_experts)

    def __call__(self, x):
        logits = self.router.classifier(x).astype(mx.float32)
        scores = mx.softmax(logits, axis=-1, precise=True)
        indices = topk_indices(scores + self.router.e_score_correction_bias.astype(mx.float32),
                               self.top_k)
        weights = mx.take_along_axis(scores, indices, axis=-1) * self.scaling
        identity = indices >= self.n_routed
        y = self.switch_mlp(x, mx.where(identity, 0, indices))
        y = mx.where(identity[..., None], x[..., None, :], y)
        return combine_experts(y, weights, x.dtype)


class LongcatLayer(nn.Module):
    def __init__(self, args: ModelArgs, rope, scale):
        super().__init__()
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = [longcat_mla(args, rope, scale) for _ in range(2)]
        self.mlps = [MLP(args.hidden_size, args.ffn_hidden_size, args.hidden_act)
                     for _ in range(2)]
        self.input_layernorm = [norm() for _ in range(2)]
        self.post_attention_layernorm = [norm() for _ in range(2)]
        self.mlp = ZeroExpertMoE(args)

    def __call__(self, h, masks, offset, caches):
        shortcut = None
        for i in range(2):
            h = h + self.self_attn[i](self.input_layernorm[i](h), masks[i], offset, caches[i])
            x = self.post_attention_layernorm[i](h)
            if i == 0:
                shortcut = self.mlp(x)
            h = h + self.mlps[i](x)
        return h + shortcut


class LongcatStack(DecoderStack):
    """The decoder stack handing each layer the masks and caches of its two
    attention sublayers."""

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        cache = cache if cache is not None else [None] * (2 * len(self.layers))
        for i, layer in enumerate(self.layers):
            h = layer(h, masks[2 * i: 2 * i + 2], offset, cache[2 * i: 2 * i + 2])
        return self.norm(h)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        rope = make_rope(args.qk_rope_head_dim, args.rope_theta, True, args.rope_scaling,
                         args.max_position_embeddings)
        scale = mla_softmax_scale(args.qk_nope_head_dim + args.qk_rope_head_dim,
                                  args.rope_scaling)
        layers = [LongcatLayer(args, rope, scale) for _ in range(args.num_layers)]
        self.model = LongcatStack(args.vocab_size, args.hidden_size, layers,
                                  RMSNorm(args.hidden_size, args.rms_norm_eps))
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        # One entry per attention sublayer: what the masks and caches are built from.
        self.layer_windows = [None] * (2 * args.num_layers)

    def sanitize(self, weights):
        weights = super().sanitize(weights)
        n = self.args.num_layers
        # Multi-token-prediction layers after the decoder.
        weights = {k: v for k, v in weights.items()
                   if not k.startswith("model.mtp")
                   and not (k.startswith("model.layers.") and int(k.split(".")[2]) >= n)}
        for i in range(n):
            prefix = f"model.layers.{i}"
            for j in range(2):
                merge_absorbed_kv_b(weights, f"{prefix}.self_attn.{j}",
                                    self.args.qk_nope_head_dim, self.args.kv_lora_rank)
            # transformers saves projections for the zero experts, which compute nothing.
            for e in range(self.args.n_routed_experts,
                           self.args.n_routed_experts + (self.args.zero_expert_num or 0)):
                for k in [k for k in weights if k.startswith(f"{prefix}.mlp.experts.{e}.")]:
                    weights.pop(k)
            stack_experts(weights, f"{prefix}.mlp", self.args.n_routed_experts)
            # transformers' in-memory gate_up_proj has rows for the zero experts too.
            for name in ("gate_proj", "up_proj"):
                key = f"{prefix}.mlp.switch_mlp.{name}.weight"
                if key in weights:
                    weights[key] = weights[key][: self.args.n_routed_experts]
            # mlx-lm's conversions name the stacked experts ``experts``.
            for name in ("gate_proj", "up_proj", "down_proj"):
                for param in ("weight", "scales", "biases"):
                    key = f"{prefix}.mlp.experts.{name}.{param}"
                    if key in weights:
                        weights[f"{prefix}.mlp.switch_mlp.{name}.{param}"] = weights.pop(key)
        return weights
