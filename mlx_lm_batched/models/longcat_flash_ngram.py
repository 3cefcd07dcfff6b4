"""LongCat-Flash with n-gram embeddings: each token's embedding adds, for every
n-gram order 2..``emb_neighbor_num`` and each of ``emb_split_num`` hash tables, a
projected embedding of the hashed n-gram ending at it, then divides by the number of
terms. The last ``emb_neighbor_num - 1`` token ids of each row are the state of the
first cache (a ``StateCache``); before a row's first token the ids are 0, also for a
left-padded row (positions below 0 read as 0), so padded rows equal rows alone."""

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..cache.state import StateCache
from ..layers.norms import RMSNorm
from ..layers.stack import DecoderStack
from . import longcat_flash


@dataclass
class ModelArgs(longcat_flash.ModelArgs):
    ngram_vocab_size_ratio: int = 78
    emb_neighbor_num: int = 4
    emb_split_num: int = 4
    zero_expert_type: str = "identity"

    def __post_init__(self):
        super().__post_init__()
        if self.zero_expert_type != "identity":
            raise NotImplementedError(f"longcat_flash_ngram: zero_expert_type "
                                      f"'{self.zero_expert_type}' is not supported")


class NgramEmbedding(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.vocab_size = args.vocab_size
        self.n, self.k = args.emb_neighbor_num, args.emb_split_num
        base = args.ngram_vocab_size_ratio * args.vocab_size
        tables = self.k * (self.n - 1)
        dims = args.hidden_size // tables
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        # Table t hashes modulo base + 2t + 1.
        self.table_sizes = [base + 2 * t + 1 for t in range(tables)]
        self.embedders = [nn.Embedding(size, dims) for size in self.table_sizes]
        self.post_projs = [nn.Linear(dims, args.hidden_size, bias=False) for _ in range(tables)]

    def __call__(self, inputs, offset, state):
        """Embeddings of ``inputs`` ``(B, L)``; ``state``: the ``StateCache`` of the last
        ``n - 1`` ids (or None). Returns ``(B, L, hidden)``."""
        B, L = inputs.shape
        ctx = self.n - 1
        ids = inputs.astype(mx.int64)
        before = state[0] if state is not None and not state.empty() else \
            mx.zeros((B, ctx), mx.int64)
        context = mx.concatenate([before, ids], axis=1)  # (B, ctx + L)
        positions = offset[:, None] - ctx + mx.arange(ctx + L)
        context = mx.where(positions >= 0, context, 0)  # nothing before a row's first token
        if state is not None:
            state[0] = context[:, -ctx:]
            state.advance(L)
        # shifted[s]: the id s tokens back of each input column.
        shifted = [context[:, ctx - s: ctx - s + L] for s in range(ctx + 1)]
        x = self.word_embeddings(inputs)
        for order in range(2, self.n + 1):
            for j in range(self.k):
                t = (order - 2) * self.k + j
                size = self.table_sizes[t]
                h, power = shifted[0], 1
                for s in range(1, order):
                    power = (power * self.vocab_size) % size
                    h = h + shifted[s] * power
                x = x + self.post_projs[t](self.embedders[t](h % size))
        return x / (1 + self.k * (self.n - 1))


class NgramStack(DecoderStack):
    """LongCat's stack behind n-gram embeddings: cache 0 holds the n-gram context,
    then two caches per decoder layer."""

    def __init__(self, args, layers, norm):
        super().__init__(args.vocab_size, args.hidden_size, layers, norm)
        self.pop("embed_tokens")  # the word embeddings live in the n-gram module
        self.ngram_embeddings = NgramEmbedding(args)

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        if input_embeddings is not None:
            raise ValueError("longcat_flash_ngram: input embeddings are not supported "
                             "(its embeddings depend on the preceding token ids)")
        cache = cache if cache is not None else [None] * (1 + 2 * len(self.layers))
        h = self.ngram_embeddings(inputs, offset, cache[0])
        for i, layer in enumerate(self.layers):
            h = layer(h, masks[1 + 2 * i: 3 + 2 * i], offset, cache[1 + 2 * i: 3 + 2 * i])
        return self.norm(h)


class Model(longcat_flash.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = NgramStack(args, self.model.layers, RMSNorm(args.hidden_size,
                                                                 args.rms_norm_eps))
        # The n-gram context cache first, then one per attention sublayer.
        self.layer_windows = [None] * (1 + 2 * args.num_layers)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def make_cache(self, max_kv_size=None):
        caches = super().make_cache(max_kv_size)
        caches[0] = StateCache(1)
        return caches

    def sanitize(self, weights):
        key = "model.embed_tokens.weight"
        if key in weights:
            weights["model.ngram_embeddings.word_embeddings.weight"] = weights.pop(key)
        return super().sanitize(weights)

    @property
    def layers(self):
        return self.model.layers
