"""Gemma 4 (text). What differs from Gemma 3:

- norms scale by ``w`` (not ``1 + w``); values get an RMS norm without weight; QK-norm
  replaces the query scaling (attention scale 1);
- global layers have their own head size and key/value heads (``global_head_dim``,
  ``num_global_key_value_heads``, or transformers' ``per_layer_config``) and a
  ``proportional`` RoPE; ``attention_k_eq_v``: their values are the key projection;
- per-layer inputs (PLE, the E2B/E4B models): a second token embedding plus a
  projection of the embeddings give each layer a small input, gated into its output;
- the last ``num_kv_shared_layers`` layers reuse an earlier layer's keys and values
  (models/kv_sharing.py), with a double-wide MLP under ``use_double_wide_mlp``;
- ``enable_moe_block``: a routed expert block next to the dense MLP (26B-A4B);
- every layer's output is scaled by a learned ``layer_scalar``.
"""

from dataclasses import dataclass
from functools import partial
from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm, Scores
from ..layers.blocks import SandwichBlock
from ..layers.kv_sharing import (
    SharedKVAttention,
    drop_shared_kv_weights,
    kv_sources,
    layer_inputs,
)
from ..layers.mlp import MLP, activation
from ..layers.moe import SwitchGLU, combine_experts, softmax_topk, stack_experts
from ..layers.norms import RMSNorm, unit_rms_norm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM, DecoderStack
from . import gemma
from .common import type_windows

# transformers' Gemma4TextConfig RoPE when a config names none.
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
# Per-layer overrides (transformers' ``per_layer_config``) this file implements.
PER_LAYER_KEYS = ("head_dim", "num_key_value_heads")


@dataclass
class ModelArgs(gemma.ModelArgs):
    vocab_size: int = 262144
    num_key_value_heads: Optional[int] = 4
    max_position_embeddings: int = 131072
    hidden_activation: Optional[str] = "gelu_pytorch_tanh"
    sliding_window: int = 512
    layer_types: Optional[List[str]] = None
    sliding_window_pattern: Optional[int] = None  # mlx-lm's: every p-th layer is global
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    rope_parameters_by_type: Optional[dict] = None
    final_logit_softcapping: Optional[float] = None
    use_bidirectional_attention: Optional[str] = None
    global_head_dim: int = 512
    num_global_key_value_heads: Optional[int] = None
    per_layer_config: Optional[dict] = None
    attention_k_eq_v: bool = False
    vocab_size_per_layer_input: int = 262144
    hidden_size_per_layer_input: int = 256
    num_kv_shared_layers: int = 0
    use_double_wide_mlp: bool = False
    enable_moe_block: bool = False
    num_experts: Optional[int] = None
    top_k_experts: Optional[int] = None
    moe_intermediate_size: Optional[int] = None
    pad_token_id: Optional[int] = 0
    # mlx-lm's fields: it keeps them and reads the partial rotation from
    # ``rope_parameters`` (as this file does), so they size nothing.
    global_partial_rotary_factor: float = 0.25
    partial_rotary_factor: float = 1.0

    @classmethod
    def from_dict(cls, params):
        if not any(k in params for k in ("rope_parameters", "rope_theta", "rope_scaling")):
            params = dict(params, rope_parameters=DEFAULT_ROPE)
        return super().from_dict(params)

    def __post_init__(self):
        super().__post_init__()
        if self.use_bidirectional_attention == "all":
            raise ValueError(f"{self.model_type}: use_bidirectional_attention='all' (attention "
                             "without a causal mask) is not supported; causal and 'vision' are")
        if self.layer_types is None:  # transformers: five sliding layers per global one
            period = self.sliding_window_pattern or 6
            self.layer_types = ["full_attention" if (i + 1) % period == 0
                                else "sliding_attention" for i in range(self.num_hidden_layers)]
        self.layer_types = list(self.layer_types)
        self.layer_types[-1] = "full_attention"  # transformers forces it too
        if self.hidden_size_per_layer_input and self.vocab_size_per_layer_input < self.vocab_size:
            # Ids past the per-layer table have no embedding there (transformers fails on
            # them too); refused here rather than read out of bounds.
            raise ValueError(f"{self.model_type}: vocab_size_per_layer_input "
                             f"{self.vocab_size_per_layer_input} is below vocab_size "
                             f"{self.vocab_size}")

    def layer_dims(self):
        """``(head_dim, n_kv_heads)`` per layer, as transformers resolves them."""
        base = (self.head_dim, self.num_key_value_heads)
        if self.per_layer_config is not None:  # transformers >= 5.x writes the overrides
            dims = [base] * self.num_hidden_layers
            for key, override in self.per_layer_config.items():
                i = int(key)
                unknown = sorted(set(override) - set(PER_LAYER_KEYS))
                if unknown or not 0 <= i < self.num_hidden_layers:
                    raise ValueError(f"{self.model_type}: per_layer_config['{key}'] overrides "
                                     f"{unknown or 'a layer out of range'}; supported: layers "
                                     f"0..{self.num_hidden_layers - 1}, keys {PER_LAYER_KEYS}")
                dims[i] = (override.get("head_dim", base[0]),
                           override.get("num_key_value_heads", base[1]))
            return dims
        global_kv = base[1]
        if self.attention_k_eq_v and self.num_global_key_value_heads is not None:
            global_kv = self.num_global_key_value_heads
        return [(self.global_head_dim, global_kv) if t == "full_attention" else base
                for t in self.layer_types]

    def rope(self, kind, dim):
        """The RoPE of ``kind`` layers (global or sliding) over ``dim`` features."""
        if kind == "full_attention":
            return make_rope(dim, self.rope_theta, self.rope_traditional, self.rope_scaling,
                             self.max_position_embeddings)
        local = (self.rope_parameters_by_type or {}).get("sliding_attention") or {}
        scaling = local if local.get("rope_type", "default") != "default" else None
        return make_rope(dim, local.get("rope_theta", self.rope_local_base_freq),
                         self.rope_traditional, scaling,
                         self.max_position_embeddings)


class Router(nn.Module):
    """Gemma 4's expert router: a weightless RMS norm, a learned ``scale`` and
    ``hidden**-0.5``, softmax top-k renormalised, times each chosen expert's scale."""

    def __init__(self, hidden_size, num_experts, top_k, eps):
        super().__init__()
        self.proj = nn.Linear(hidden_size, num_experts, bias=False)
        self.scale = mx.ones((hidden_size,))
        self.per_expert_scale = mx.ones((num_experts,))
        self.top_k, self.eps, self.root = top_k, eps, hidden_size**-0.5

    def __call__(self, x):
        x = mx.fast.rms_norm(x, self.scale * self.root, self.eps)
        indices, weights = softmax_topk(self.proj(x), self.top_k, normalize=True)
        return indices, weights * self.per_expert_scale[indices].astype(mx.float32)


class Block(SandwichBlock):
    """Gemma's sandwich block, plus the expert block beside the MLP, the gated
    per-layer input and the output's ``layer_scalar``."""

    def __init__(self, args, attn, mlp, norm):
        super().__init__(attn, mlp, norm)
        if args.enable_moe_block:
            self.router = Router(args.hidden_size, args.num_experts, args.top_k_experts,
                                 args.rms_norm_eps)
            self.experts = SwitchGLU(args.hidden_size, args.moe_intermediate_size,
                                     args.num_experts, activation(args.hidden_activation))
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                         "pre_feedforward_layernorm_2"):
                setattr(self, name, norm())
        per_layer = args.hidden_size_per_layer_input
        if per_layer:
            self.per_layer_input_gate = nn.Linear(args.hidden_size, per_layer, bias=False)
            self.per_layer_projection = nn.Linear(per_layer, args.hidden_size, bias=False)
            self.post_per_layer_input_norm = norm()
            self.act = activation(args.hidden_activation)
        self.layer_scalar = mx.ones((1,))

    def __call__(self, x, mask, offset, cache=None, attention=None, per_layer_input=None):
        h = x + self.post_attention_layernorm(
            self.self_attn(self.input_layernorm(x), mask, offset, cache, attention))
        r = self.mlp(self.pre_feedforward_layernorm(h))
        if "router" in self:  # experts read the block's input, not the MLP's
            indices, weights = self.router(h)
            y = self.experts(self.pre_feedforward_layernorm_2(h), indices)
            r = (self.post_feedforward_layernorm_1(r)
                 + self.post_feedforward_layernorm_2(combine_experts(y, weights, h.dtype)))
        h = h + self.post_feedforward_layernorm(r)
        if per_layer_input is not None:
            g = self.act(self.per_layer_input_gate(h)) * per_layer_input
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return h * self.layer_scalar


class Stack(DecoderStack):
    """Embeddings, blocks and final norm with per-layer inputs and KV sharing.

    ``placeholder_ids``: token ids read as ``pad_token_id`` (the multimodal model's
    image/video/audio placeholders, which transformers embeds as padding when no
    media is given)."""

    def __init__(self, args, layers, norm, sources, placeholder_ids=()):
        super().__init__(args.vocab_size, args.hidden_size, layers, norm,
                         embed_scale=args.hidden_size**0.5)
        self.per_layer_dims = args.hidden_size_per_layer_input
        if self.per_layer_dims:
            width = len(layers) * self.per_layer_dims
            self.embed_tokens_per_layer = nn.Embedding(args.vocab_size_per_layer_input, width)
            self.per_layer_model_projection = nn.Linear(args.hidden_size, width, bias=False)
            self.per_layer_projection_norm = RMSNorm(self.per_layer_dims, args.rms_norm_eps)
        self.sources = sources
        self.placeholder_ids = tuple(placeholder_ids)
        self.pad_token_id = args.pad_token_id or 0

    def token_ids(self, input_embeddings):
        """``(B, L)`` ids whose embedding rows are nearest ``input_embeddings`` (as
        mlx-lm and transformers recover them when only embeddings are given, to look up
        the per-layer inputs). Costs a ``(B, L, vocab)`` distance array."""
        table = self.embed_tokens
        if isinstance(table, nn.QuantizedEmbedding):
            table = mx.dequantize(table.weight, table.scales, table.get("biases"),
                                  table.group_size, table.bits, mode=table.mode)
        else:
            table = table.weight
        # |e - x|^2 up to |x|^2, which is the same for every row of the table
        distance = mx.square(table).sum(-1) - 2 * self.embed_tokens.as_linear(input_embeddings)
        return mx.stop_gradient(mx.argmin(distance, axis=-1))

    def _get_per_layer_inputs(self, inputs, input_embeddings=None):
        """The token part of the per-layer inputs, ``(B, L, layers, per_layer_dims)``
        (mlx-lm's name); ``inputs`` None: the ids nearest ``input_embeddings``."""
        if inputs is None:
            inputs = self.token_ids(input_embeddings)
        tokens = self.embed_tokens_per_layer(inputs) * self.per_layer_dims**0.5
        return tokens.reshape(*inputs.shape, len(self.layers), self.per_layer_dims)

    def project_per_layer_inputs(self, tokens, h):
        """``(B, L, layers, per_layer_dims)``: the per-layer token part ``tokens`` and
        a normed projection of the (scaled) embeddings, averaged by ``2**-0.5``."""
        proj = self.per_layer_model_projection(h) * h.shape[-1] ** -0.5
        proj = self.per_layer_projection_norm(proj.reshape(tokens.shape))
        return (proj + tokens) * 2**-0.5

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None,
                 per_layer_inputs=None):
        """``per_layer_inputs``: the token part of the per-layer inputs (mlx-lm's
        keyword; default: looked up from ``inputs``)."""
        if self.placeholder_ids:
            hit = (inputs[..., None] == mx.array(self.placeholder_ids)).any(axis=-1)
            inputs = mx.where(hit, self.pad_token_id, inputs)
        h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        h = h * self.embed_scale  # a Python float: stays in the compute dtype
        per_layer = None
        if self.per_layer_dims:
            if per_layer_inputs is None:
                per_layer_inputs = self._get_per_layer_inputs(inputs)
            per_layer = self.project_per_layer_inputs(per_layer_inputs, h)
        inputs_per_layer = layer_inputs(self.sources, cache, masks)
        for i, (layer, (m, c)) in enumerate(zip(self.layers, inputs_per_layer)):
            h = layer(h, m, offset, c, attention, None if per_layer is None else per_layer[:, :, i])
        return self.norm(h)


def Gemma4TextModel(args: ModelArgs):
    """mlx-lm's name for the text stack (``Model(args).model``: the embeddings with
    their ``embed_scale``, the blocks and the final norm, under the same parameter
    names); it is called as this package's stacks are, by :class:`Model`."""
    return Model(args).model


class Model(CausalLM):
    """``layer_windows`` and the cache list cover the layers that own keys and values
    (all but the last ``num_kv_shared_layers``); the others use their source's."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)  # noqa: E731
        v_norm = partial(unit_rms_norm, eps=args.rms_norm_eps)
        dims = args.layer_dims()
        sources = kv_sources(args.layer_types, args.num_kv_shared_layers)
        ropes = {key: args.rope(*key) for key in zip(args.layer_types, (d for d, _ in dims))}
        layers = []
        for i, (kind, (head_dim, n_kv)) in enumerate(zip(args.layer_types, dims)):
            common = dict(rope=ropes[kind, head_dim], qk_norm=QKNorm(norm),
                          scores=Scores(scale=1.0))
            if sources[i] == i:
                projections = Projections(
                    bias=args.attention_bias, v_norm=v_norm,
                    values_from_keys=args.attention_k_eq_v and kind == "full_attention")
                attn = Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                                 projections=projections, **common)
            else:
                attn = SharedKVAttention(args.hidden_size, args.num_attention_heads, n_kv,
                                         head_dim,
                                         projections=Projections(bias=args.attention_bias),
                                         **common)
            wide = 2 if args.use_double_wide_mlp and sources[i] != i else 1
            mlp = MLP(args.hidden_size, args.intermediate_size * wide, args.hidden_activation)
            layers.append(Block(args, attn, mlp, norm))
        self.model = Stack(args, layers, norm(), sources, self.placeholder_ids(args))
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.final_logit_softcap = args.final_logit_softcapping
        owners = len(layers) - args.num_kv_shared_layers
        self.layer_windows = type_windows(args.layer_types[:owners], args.sliding_window)

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 attention=None, per_layer_inputs=None):
        """Logits, as every model's; ``inputs`` may be None when ``input_embeddings``
        are given (the ids are then those nearest the embeddings, as mlx-lm reads
        them), and ``per_layer_inputs`` (mlx-lm's keyword) replaces the per-layer
        inputs' token part."""
        if inputs is None:
            if input_embeddings is None:
                raise ValueError(f"{self.model_type}: pass inputs or input_embeddings")
            inputs = self.model.token_ids(input_embeddings)
        stack_inputs = {} if per_layer_inputs is None else {"per_layer_inputs": per_layer_inputs}
        return super().__call__(inputs, mask, offset, cache, input_embeddings, attention,
                                **stack_inputs)

    def placeholder_ids(self, args):
        """Token ids embedded as padding (none in the text model)."""
        return ()

    def sanitize(self, weights):
        """transformers' (and mlx-lm's) names to ours: stacked experts, no key/value
        weights in KV-sharing layers (hub checkpoints may carry unused ones)."""
        weights = drop_shared_kv_weights(super().sanitize(weights), self.model.sources)
        # mlx-lm's expert layout
        out = {k.replace(".experts.switch_glu.", ".experts."): v for k, v in weights.items()}
        if self.args.enable_moe_block:
            for i in range(len(self.layers)):
                stack_experts(out, f"model.layers.{i}", self.args.num_experts, src="experts",
                              dst="experts")
        return out
