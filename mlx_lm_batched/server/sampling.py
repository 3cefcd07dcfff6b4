"""A request's sampling parameters -> one sampler and logits processors per row.

Unseeded rows with equal settings share one sampler object (the batch samples them in
one call) drawing from the engine's global random stream. A seeded row gets its own
:class:`SeededSampler` whose key stream starts at ``mx.random.key(seed)``: its tokens do
not depend on what else is in the batch, or on when it joined.
"""

import mlx.core as mx

from ..sampling.grammar import GrammarProcessor
from ..sampling.logits_processors import make_logits_processors, make_min_tokens_processor
from ..sampling.stop_sequences import StopSequences
from ..sampling.samplers import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_sampler,
)

_GOLDEN = 0x9E3779B97F4A7C15  # spreads the keys of a request's choices apart


class SeededSampler:
    """Sample ``(B, V)`` logprobs with filters (mlx-lm's order: top-p, min-p, top-k)
    and a private key stream split once per call (one call per generated token)."""

    def __init__(self, seed, temperature, top_p=1.0, min_p=0.0, top_k=0):
        self.key = mx.random.key(seed % (1 << 64))
        self.temperature = temperature
        self.top_p, self.min_p, self.top_k = top_p, min_p, top_k

    def __call__(self, logprobs):
        x = logprobs
        if 0 < self.top_p < 1:
            x = apply_top_p(x, self.top_p)
        if self.min_p > 0:
            x = apply_min_p(x, self.min_p)
        if self.top_k > 0:
            x = apply_top_k(x, self.top_k)
        self.key, sub = mx.random.split(self.key)
        return mx.random.categorical(x * (1.0 / self.temperature), key=sub)


class SamplerFactory:
    """Samplers for rows; unseeded ones are shared per distinct setting."""

    def __init__(self):
        self._shared = {}

    def row_sampler(self, params, choice):
        """The sampler of choice ``choice`` (0-based) of a request with ``params``."""
        if params.temperature == 0:
            return greedy_sampler
        if params.seed is not None:
            seed = params.seed + choice * _GOLDEN
            return SeededSampler(seed, params.temperature, params.top_p, params.min_p, params.top_k)
        key = (params.temperature, params.top_p, params.min_p, params.top_k)
        if key not in self._shared:
            if len(self._shared) >= 256:  # settings vary per client: keep the map bounded
                self._shared.clear()
            self._shared[key] = make_sampler(params.temperature, top_p=params.top_p,
                                             min_p=params.min_p, top_k=params.top_k)
        return self._shared[key]


def row_processors(params, tokenizer):
    """Logits processors of one row (logit bias, penalties, ``min_tokens`` and its own
    grammar matcher when the request is constrained; none when unused)."""
    procs = make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty or None,
        frequency_penalty=params.frequency_penalty or None,
    )
    if params.min_tokens:
        procs.append(make_min_tokens_processor(row_stop_ids(params, tokenizer), params.min_tokens))
    if params.constraint is not None:  # last: the mask applies to the final logits
        procs.append(GrammarProcessor(tokenizer, params.constraint))
    return procs


def row_stop_ids(params, tokenizer):
    """The token ids that end one row: EOS (unless ``ignore_eos``) and ``stop_token_ids``."""
    eos = [] if params.ignore_eos else [int(t) for t in tokenizer.eos_token_ids]
    return eos + list(params.stop_token_ids)


def row_stops(params, tokenizer):
    """The row's :class:`StopSequences`, or None for the generator's default (EOS)."""
    if not params.ignore_eos and not params.stop_token_ids:
        return None
    return StopSequences([[t] for t in row_stop_ids(params, tokenizer)])
