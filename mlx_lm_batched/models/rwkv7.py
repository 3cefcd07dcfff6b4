"""RWKV-7 ("Goose", flash-linear-attention's ``rwkv7`` checkpoints): a stack of
time-mixing (generalised delta rule) and channel-mixing layers, one ``StateCache``
(two token-shift states and the delta-rule state) per layer; see ``layers/rwkv.py``."""

from dataclasses import dataclass

import mlx.nn as nn

from ..cache.state import StateCache
from ..layers.norms import LayerNorm
from ..layers.rwkv import Rwkv7Block
from ..layers.step import resolve_offset
from .common import StackArgs

# Parameters flash-linear-attention stores flat that are per head here.
_PER_HEAD = ("k_k", "k_a", "r_k", "g_norm.weight", "g_norm.bias")


@dataclass
class ModelArgs(StackArgs):
    """flash-linear-attention's ``RWKV7Config`` names (mlx-lm's required fields)."""

    vocab_size: int
    intermediate_size: int
    head_dim: int
    a_low_rank_dim: int
    v_low_rank_dim: int
    gate_low_rank_dim: int
    decay_low_rank_dim: int
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False

    def __post_init__(self):
        if self.hidden_size % self.head_dim:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"head_dim {self.head_dim}")


class Backbone(nn.Module):
    def __init__(self, args):
        super().__init__()
        ranks = (args.decay_low_rank_dim, args.a_low_rank_dim, args.v_low_rank_dim,
                 args.gate_low_rank_dim)
        self.embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        # The group norm's epsilon scales with the head (flash-linear-attention's
        # ``head_dim * norm_eps``; 64e-5 for the released models).
        self.layers = [Rwkv7Block(args.hidden_size, args.intermediate_size, args.head_dim, i,
                                  ranks, args.norm_eps, args.head_dim * args.norm_eps)
                       for i in range(args.num_hidden_layers)]
        self.norm = LayerNorm(args.hidden_size, args.norm_eps)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = Backbone(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs, mask=None, offset=None, cache=None, input_embeddings=None,
                 attention=None):
        """Logits ``(B, L, vocab)``; ``offset`` as for every model (padding columns have
        negative positions); ``mask``/``attention`` are not needed by a recurrent stack."""
        offset = resolve_offset(inputs, offset, cache)
        h = self.model.embeddings(inputs) if input_embeddings is None else input_embeddings
        cache = cache if cache is not None else [None] * len(self.layers)
        v_first = None
        for layer, c in zip(self.layers, cache):
            h, v_first = layer(h, v_first, offset, c)
        h = self.model.norm(h)
        if "lm_head" in self:
            return self.lm_head(h)
        return self.model.embeddings.as_linear(h)

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` of three arrays per layer (no key/value cache to bound)."""
        return [StateCache(3) for _ in self.layers]

    def sanitize(self, weights):
        H, D = self.args.hidden_size // self.args.head_dim, self.args.head_dim
        out = {}
        for k, v in weights.items():
            if k.endswith(_PER_HEAD):
                v = v.reshape(H, D)
            out[k] = v
        if self.args.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        return out
