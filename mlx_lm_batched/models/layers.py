"""Shared transformer layers, parameterised so architecture files stay thin.

Parameter names follow Hugging Face checkpoints (``self_attn.q_proj``,
``mlp.gate_proj``, ``input_layernorm`` ...) so weights load without renaming.
"""

import mlx.core as mx
import mlx.nn as nn

from . import cpu_ops
# Re-exported: architecture files build everything from this module.
from .attention import Attention, grouped_attention, scaled_dot_product_attention  # noqa: F401
from .base import resolve_masks, resolve_offset
from .kv_cache import KVCache, RotatingKVCache


class RMSNorm(nn.Module):
    """RMS norm; ``zero_centered`` stores ``w`` and scales by ``1 + w`` (Gemma);
    ``affine=False`` has no weight (Llama 4's L2 QK-norm)."""

    def __init__(self, dims, eps=1e-6, zero_centered=False, affine=True):
        super().__init__()
        if affine:
            self.weight = mx.zeros((dims,)) if zero_centered else mx.ones((dims,))
        self.eps = eps
        self.zero_centered = zero_centered

    def __call__(self, x):
        if "weight" not in self:
            return mx.fast.rms_norm(x, None, self.eps)
        w = 1.0 + self.weight if self.zero_centered else self.weight
        return mx.fast.rms_norm(x, w, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with optional bias; ``zero_centered`` scales by ``1 + w`` (Nemotron's
    LayerNorm1P)."""

    def __init__(self, dims, eps=1e-5, bias=True, zero_centered=False):
        super().__init__()
        self.weight = mx.zeros((dims,)) if zero_centered else mx.ones((dims,))
        if bias:
            self.bias = mx.zeros((dims,))
        self.eps = eps
        self.zero_centered = zero_centered

    def __call__(self, x):
        w = 1.0 + self.weight if self.zero_centered else self.weight
        return mx.fast.layer_norm(x, w, self.get("bias"), self.eps)


class HeadwiseLayerNorm(nn.Module):
    """LayerNorm of each head of a ``(..., heads * head_dim)`` projection with its own
    ``(heads, head_dim)`` weight (Cohere, StableLM QK-norm; use ``qk_norm_full``)."""

    def __init__(self, heads, head_dim, eps=1e-5, bias=False):
        super().__init__()
        self.weight = mx.ones((heads, head_dim))
        if bias:
            self.bias = mx.zeros((heads, head_dim))
        self.eps = eps

    def __call__(self, x):
        heads, head_dim = self.weight.shape
        h = mx.fast.layer_norm(x.reshape(*x.shape[:-1], heads, head_dim), None, None, self.eps)
        h = h * self.weight
        if "bias" in self:
            h = h + self.bias
        return h.reshape(x.shape)


ACTIVATIONS = {
    "silu": cpu_ops.silu,
    "swish": cpu_ops.silu,
    "gelu": nn.gelu,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_new": nn.gelu_approx,
    "gelu_fast": nn.gelu_fast_approx,
    "relu": nn.relu,
    "relu2": lambda x: mx.square(nn.relu(x)),
}


def activation(name):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation '{name}' (known: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


class MLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, hidden_size, intermediate_size, act="silu", bias=False, fused_gate_up=False):
        """``fused_gate_up``: one ``gate_up_proj`` holding gate then up (GLM 4, Phi 3)."""
        super().__init__()
        if fused_gate_up:
            self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        else:
            self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
            self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = activation(act) if isinstance(act, str) else act
        self.fused_gate_up = fused_gate_up

    def __call__(self, x):
        if self.fused_gate_up:
            gate, up = mx.split(self.gate_up_proj(x), 2, axis=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


class DenseMLP(nn.Module):
    """Ungated MLP ``down(act(up(x)))``; ``names``: the checkpoint's (up, down) names."""

    def __init__(self, hidden_size, intermediate_size, act="gelu", bias=True,
                 names=("up_proj", "down_proj")):
        super().__init__()
        self.names = tuple(names)
        setattr(self, names[0], nn.Linear(hidden_size, intermediate_size, bias=bias))
        setattr(self, names[1], nn.Linear(intermediate_size, hidden_size, bias=bias))
        self.act = activation(act) if isinstance(act, str) else act

    def __call__(self, x):
        up, down = (getattr(self, n) for n in self.names)
        return down(self.act(up(x)))


class PreNormBlock(nn.Module):
    """``h = x + attn(norm1(x)); out = h + mlp(norm2(h))`` (llama family).

    ``norm_names``: the checkpoint's names for the two norms. ``residual_scale``
    multiplies each branch before it is added (Granite's ``residual_multiplier``).
    """

    def __init__(self, attn, mlp, norm, norm_names=("input_layernorm", "post_attention_layernorm"),
                 residual_scale=None, mlp_name="mlp"):
        """``mlp_name``: the checkpoint's name for the MLP (Mixtral: ``block_sparse_moe``)."""
        super().__init__()
        self.self_attn = attn
        self.mlp_name = mlp_name
        setattr(self, mlp_name, mlp)
        self.norm_names = tuple(norm_names)
        for name in self.norm_names:
            setattr(self, name, norm())
        self.residual_scale = residual_scale

    def __call__(self, x, mask, offset, cache=None, attention=None):
        attn_norm, mlp_norm = (getattr(self, n) for n in self.norm_names)
        r = self.self_attn(attn_norm(x), mask, offset, cache, attention)
        h = x + (r if self.residual_scale is None else r * self.residual_scale)
        r = getattr(self, self.mlp_name)(mlp_norm(h))
        return h + (r if self.residual_scale is None else r * self.residual_scale)


class ParallelBlock(nn.Module):
    """``out = x + attn(norm1(x)) + mlp(norm2(x))``: attention and MLP read the same
    input (GPT-NeoX, Phi, Cohere). ``norm_names`` with one name: both branches share
    that norm (Phi, Cohere, StableLM)."""

    def __init__(self, attn, mlp, norm, norm_names=("input_layernorm", "post_attention_layernorm")):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.norm_names = tuple(norm_names)
        for name in self.norm_names:
            setattr(self, name, norm())

    def __call__(self, x, mask, offset, cache=None, attention=None):
        h = getattr(self, self.norm_names[0])(x)
        m = h if len(self.norm_names) == 1 else getattr(self, self.norm_names[1])(x)
        return x + self.self_attn(h, mask, offset, cache, attention) + self.mlp(m)


class SandwichBlock(nn.Module):
    """Norms before and after both attention and MLP (Gemma 2/3).

    ``norm_names``: the checkpoint's names for the (pre-attention, post-attention,
    pre-MLP, post-MLP) norms; a None name means no norm there (OLMo 2 and EXAONE 4
    have post-norms only; GLM 4 names them differently).
    """

    NORM_NAMES = ("input_layernorm", "post_attention_layernorm",
                  "pre_feedforward_layernorm", "post_feedforward_layernorm")

    def __init__(self, attn, mlp, norm, norm_names=NORM_NAMES):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.norm_names = tuple(norm_names)
        for name in self.norm_names:
            if name is not None:
                setattr(self, name, norm())

    def _norm(self, i, x):
        name = self.norm_names[i]
        return x if name is None else getattr(self, name)(x)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        h = x + self._norm(1, self.self_attn(self._norm(0, x), mask, offset, cache, attention))
        return h + self._norm(3, self.mlp(self._norm(2, h)))


class DecoderStack(nn.Module):
    """Embedding, blocks and final norm: HF's ``model.*`` submodule."""

    def __init__(self, vocab_size, hidden_size, layers, norm, embed_scale=None, max_positions=None):
        """``max_positions``: learned absolute position embeddings ``embed_positions``
        (GPT-2), indexed by each row's positions (padding columns clipped to 0)."""
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        if max_positions:
            self.embed_positions = nn.Embedding(max_positions, hidden_size)
        self.layers = layers
        self.norm = norm
        self.embed_scale = embed_scale

    def embed(self, inputs, offset, input_embeddings=None):
        """Hidden states ``(B, L, hidden)`` entering the first block."""
        h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        if self.embed_scale is not None:
            # Python float: stays in the compute dtype instead of being rounded first.
            h = h * self.embed_scale
        if "embed_positions" in self:
            positions = mx.maximum(offset[:, None] + mx.arange(h.shape[1]), 0)
            h = h + self.embed_positions(positions)
        return h

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        cache = cache if cache is not None else [None] * len(self.layers)
        # Only steps that carry attention data pass it: blocks that take none (state
        # layers) keep the four-argument call.
        extra = () if attention is None else (attention,)
        for layer, m, c in zip(self.layers, masks, cache):
            h = layer(h, m, offset, c, *extra)
        return self.norm(h)


class CausalLM(nn.Module):
    """Shared ``__call__`` of decoder-only language models.

    Subclasses build ``self.model`` (a ``DecoderStack``), optionally ``self.lm_head``,
    and set ``self.layer_windows`` (sliding window per layer, None for global) and,
    for chunked attention (Llama 4), ``self.layer_chunks`` (chunk per layer, None
    for unchunked layers).
    """

    final_logit_softcap = None
    logit_scale = None  # a factor on the final logits (Cohere, Granite)

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 attention=None):
        """Logits ``(B, L, vocab)`` for ``inputs`` ``(B, L)``.

        ``offset``: ``(B,)`` position of each row's first column (negative for left
        padding); ``mask``: one boolean array, a list per layer, or None to build
        the masks from ``offset`` and ``cache``; ``attention``: the driver's
        per-step :class:`~.base.StepAttention` (decode row groups), or None.
        """
        offset = resolve_offset(inputs, offset, cache)
        masks = resolve_masks(mask, cache, self.layer_windows, inputs.shape[1], offset,
                              self.get("layer_chunks"))
        h = self.model(inputs, masks, offset, cache, input_embeddings, attention)
        if hasattr(self, "lm_head"):
            out = self.lm_head(h)
        else:
            out = self.model.embed_tokens.as_linear(h)
        if self.logit_scale is not None:
            out = out * self.logit_scale
        if self.final_logit_softcap is not None:
            out = mx.tanh(out / self.final_logit_softcap) * self.final_logit_softcap
        return out

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self, max_kv_size=None):
        """A full cache per global layer, a rotating one per windowed or chunked
        layer (a query never sees more than ``chunk`` slots back, so a ring of
        ``chunk`` slots is exact); with ``max_kv_size`` every layer keeps at most that
        many slots."""
        chunks = self.get("layer_chunks") or [None] * len(self.layer_windows)
        caches = []
        for w, c in zip(self.layer_windows, chunks):
            bounds = [b for b in (w, c, max_kv_size) if b is not None]
            caches.append(RotatingKVCache(min(bounds)) if bounds else KVCache())
        return caches

    def sanitize(self, weights):
        """Drop buffers HF checkpoints carry that are not parameters here."""
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if not hasattr(self, "lm_head"):
            weights.pop("lm_head.weight", None)
            weights.pop("lm_head.scales", None)
            weights.pop("lm_head.biases", None)
        return weights
