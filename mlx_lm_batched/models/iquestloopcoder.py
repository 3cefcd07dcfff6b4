"""IQuest-Coder Loop: Llama's blocks run twice with shared weights. The first pass
is plain causal attention (a full cache per layer). In the second pass each layer's
queries attend both to the first pass's keys and values of the same layer (global,
causal) and to the second pass's own (local: a sliding window of
``loop_window_size``, a rotating cache per layer), mixed per head and position by a
sigmoid gate of the query: ``g * global + (1 - g) * local``.

Caches: the first pass's ``n`` layers, then the second pass's ``n`` (mlx-lm's order);
masks follow the same order (the global attention of layer ``i`` reads layer ``i``'s
first-pass cache with its mask)."""

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..cache.kv import update_kv
from ..layers.attention import Attention, scaled_dot_product_attention
from ..layers.stack import DecoderStack
from .llama import Model as LlamaModel
from .llama import ModelArgs as LlamaArgs


@dataclass
class ModelArgs(LlamaArgs):
    rope_theta: float = 500000.0
    tie_word_embeddings: bool = False
    loop_num: int = 2
    loop_window_size: int = 64

    def __post_init__(self):
        super().__post_init__()
        if self.loop_num != 2:
            raise NotImplementedError(f"iquestloopcoder: loop_num={self.loop_num} is not "
                                      "supported (2 is)")


class LoopGate(nn.Module):
    """Per-head sigmoid gate of the queries ``(B, heads, L, D) -> (B, heads, L, 1)``."""

    def __init__(self, heads, head_dim):
        super().__init__()
        self.weight = mx.zeros((heads, head_dim))
        self.bias = mx.zeros((heads,))

    def __call__(self, q):
        logits = (q * self.weight[:, None, :].astype(q.dtype)).sum(-1, keepdims=True)
        return mx.sigmoid(logits + self.bias.astype(q.dtype)[:, None, None])


def _qkv(attn: Attention, x, offset):
    """Rotated ``(B, heads, L, D)`` queries, keys and values of ``attn`` on ``x``."""
    B, L, _ = x.shape
    q, k, v = attn.project(x)
    v = v.reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    return attn._heads(q, 0, offset), attn._heads(k, 1, offset), v


def _attend(attn: Attention, q, k, v, mask):
    return scaled_dot_product_attention(q, k, v, attn.scale, mask)


def _merge(out):
    B, _, L, _ = out.shape
    return out.transpose(0, 2, 1, 3).reshape(B, L, -1)


class LoopStack(DecoderStack):
    """The two passes over the blocks (see the module docstring)."""

    def __init__(self, vocab_size, hidden_size, layers, norm, gates):
        super().__init__(vocab_size, hidden_size, layers, norm)
        self.gate_projections = gates

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        n = len(self.layers)
        cache = cache if cache is not None else [None] * (2 * n)
        first = []
        for layer, m, c in zip(self.layers, masks[:n], cache[:n]):
            q, k, v = _qkv(layer.self_attn, layer.input_layernorm(h), offset)
            if c is not None:
                k, v = update_kv(c, k, v, offset)
            first.append((k, v))
            h = h + layer.self_attn.o_proj(_merge(_attend(layer.self_attn, q, k, v, m)))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        for i, (layer, gate) in enumerate(zip(self.layers, self.gate_projections)):
            a, c = layer.self_attn, cache[n + i]
            q, k, v = _qkv(a, layer.input_layernorm(h), offset)
            g = gate(q)
            global_out = _attend(a, q, *first[i], masks[i])
            if c is not None:
                k, v = update_kv(c, k, v, offset)
            local_out = _attend(a, q, k, v, masks[n + i])
            h = h + a.o_proj(_merge(g * global_out + (1 - g) * local_out))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)


class Model(LlamaModel):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        blocks = self.model
        gates = [LoopGate(args.num_attention_heads, args.head_dim)
                 for _ in range(args.num_hidden_layers)]
        self.model = LoopStack(args.vocab_size, args.hidden_size, blocks.layers, blocks.norm,
                               gates)
        n = args.num_hidden_layers
        self.layer_windows = [None] * n + [args.loop_window_size] * n
