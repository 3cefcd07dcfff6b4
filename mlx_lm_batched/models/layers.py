"""Shared transformer layers, parameterised so architecture files stay thin.

Parameter names follow Hugging Face checkpoints (``self_attn.q_proj``,
``mlp.gate_proj``, ``input_layernorm`` ...) so weights load without renaming.
"""

import mlx.core as mx
import mlx.nn as nn

from .base import resolve_masks, resolve_offset


class RMSNorm(nn.Module):
    """RMS norm; ``zero_centered`` stores ``w`` and scales by ``1 + w`` (Gemma)."""

    def __init__(self, dims, eps=1e-6, zero_centered=False):
        super().__init__()
        self.weight = mx.zeros((dims,)) if zero_centered else mx.ones((dims,))
        self.eps = eps
        self.zero_centered = zero_centered

    def __call__(self, x):
        w = 1.0 + self.weight if self.zero_centered else self.weight
        return mx.fast.rms_norm(x, w, self.eps)


ACTIVATIONS = {
    "silu": nn.silu,
    "swish": nn.silu,
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


def scaled_dot_product_attention(q, k, v, scale, mask, softcap=None):
    """Attention over ``(B, H, L, D)`` queries; keys/values may have fewer heads (GQA).

    ``mask`` is boolean (True = attend). Soft-capped logits need the explicit path.
    """
    if softcap is None:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    B, H, L, D = q.shape
    n_kv = k.shape[1]
    q = q.reshape(B, n_kv, H // n_kv, L, D)
    scores = (q * scale) @ mx.expand_dims(k, 2).swapaxes(-1, -2)
    scores = mx.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = mx.where(mx.expand_dims(mask, 2), scores, mx.finfo(scores.dtype).min)
    weights = mx.softmax(scores, axis=-1, precise=True)
    out = weights @ mx.expand_dims(v, 2)
    return out.reshape(B, H, L, v.shape[-1])


class Attention(nn.Module):
    """Multi-head attention with GQA, optional QK-norm, RoPE and soft-capping."""

    def __init__(
        self,
        hidden_size,
        n_heads,
        n_kv_heads,
        head_dim,
        rope=None,
        bias=False,
        o_bias=None,
        scale=None,
        qk_norm=None,
        softcap=None,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden_size, bias=bias if o_bias is None else o_bias)
        if qk_norm is not None:  # a factory: qk_norm(head_dim) -> norm module
            self.q_norm = qk_norm(head_dim)
            self.k_norm = qk_norm(head_dim)
        self.has_qk_norm = qk_norm is not None
        self.rope = rope
        self.scale = scale if scale is not None else head_dim**-0.5
        self.softcap = softcap

    def __call__(self, x, mask, offset, cache=None):
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.n_heads, -1)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1)
        if self.has_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        if self.rope is not None:
            q, k = self.rope(q, offset), self.rope(k, offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, self.scale, mask, self.softcap)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, hidden_size, intermediate_size, act="silu", bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = activation(act) if isinstance(act, str) else act

    def __call__(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PreNormBlock(nn.Module):
    """``h = x + attn(norm1(x)); out = h + mlp(norm2(h))`` (llama family)."""

    def __init__(self, attn, mlp, norm):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()

    def __call__(self, x, mask, offset, cache=None):
        h = x + self.self_attn(self.input_layernorm(x), mask, offset, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class SandwichBlock(nn.Module):
    """Norms before and after both attention and MLP (Gemma 2/3)."""

    def __init__(self, attn, mlp, norm):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def __call__(self, x, mask, offset, cache=None):
        h = x + self.post_attention_layernorm(
            self.self_attn(self.input_layernorm(x), mask, offset, cache)
        )
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class DecoderStack(nn.Module):
    """Embedding, blocks and final norm: HF's ``model.*`` submodule."""

    def __init__(self, vocab_size, hidden_size, layers, norm, embed_scale=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.layers = layers
        self.norm = norm
        self.embed_scale = embed_scale

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None):
        h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        if self.embed_scale is not None:
            # Python float: stays in the compute dtype instead of being rounded first.
            h = h * self.embed_scale
        cache = cache if cache is not None else [None] * len(self.layers)
        for layer, m, c in zip(self.layers, masks, cache):
            h = layer(h, m, offset, c)
        return self.norm(h)


class CausalLM(nn.Module):
    """Shared ``__call__`` of decoder-only language models.

    Subclasses build ``self.model`` (a ``DecoderStack``), optionally ``self.lm_head``,
    and set ``self.layer_windows`` (sliding window per layer, None for global).
    """

    final_logit_softcap = None

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None):
        """Logits ``(B, L, vocab)`` for ``inputs`` ``(B, L)``.

        ``offset``: ``(B,)`` position of each row's first column (negative for left
        padding); ``mask``: one boolean array, a list per layer, or None to build
        the masks from ``offset`` and ``cache``.
        """
        offset = resolve_offset(inputs, offset, cache)
        masks = resolve_masks(mask, cache, self.layer_windows, inputs.shape[1], offset)
        h = self.model(inputs, masks, offset, cache, input_embeddings)
        if hasattr(self, "lm_head"):
            out = self.lm_head(h)
        else:
            out = self.model.embed_tokens.as_linear(h)
        if self.final_logit_softcap is not None:
            out = mx.tanh(out / self.final_logit_softcap) * self.final_logit_softcap
        return out

    @property
    def layers(self):
        return self.model.layers

    def sanitize(self, weights):
        """Drop buffers HF checkpoints carry that are not parameters here."""
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if not hasattr(self, "lm_head"):
            weights.pop("lm_head.weight", None)
            weights.pop("lm_head.scales", None)
            weights.pop("lm_head.biases", None)
        return weights


def default_head_dim(hidden_size, n_heads, head_dim=None):
    return head_dim if head_dim else hidden_size // n_heads
