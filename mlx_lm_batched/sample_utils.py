"""mlx-lm's ``mlx_lm.sample_utils``: samplers and logits processors (``sampling/``)."""

from .sampling.logits_processors import (
    LogitsProcessor,
    make_frequency_penalty,
    make_logits_processors,
    make_presence_penalty,
    make_repetition_penalty,
)
from .sampling.samplers import (
    BatchSampler,
    Sampler,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    categorical_sampling,
    greedy_sampler,
    make_sampler,
    make_seeded_sampler,
)

__all__ = ["BatchSampler", "LogitsProcessor", "Sampler", "apply_min_p", "apply_top_k",
           "apply_top_p", "apply_xtc", "categorical_sampling", "greedy_sampler",
           "make_frequency_penalty", "make_logits_processors", "make_presence_penalty",
           "make_repetition_penalty", "make_sampler", "make_seeded_sampler"]
