"""What the generation API returns: mlx-lm's ``GenerationResponse`` and ``BatchResponse``
(same fields; ``BatchResponse.stats`` is a ``sched.stats.BatchStats``, mlx-lm's
``generate_utils.BatchStats``) and a streamed batch row's ``BatchStreamResponse``."""

from dataclasses import dataclass, field
from typing import List, Optional

import mlx.core as mx

from ..sched.stats import BatchStats


@dataclass
class GenerationResponse:
    """One step of :func:`stream_generate` (the fields of mlx-lm's)."""

    text: str
    token: int
    logprobs: mx.array
    from_draft: bool
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: Optional[str] = None


@dataclass
class BatchResponse:
    """Result of :func:`batch_generate` (the fields of mlx-lm's)."""

    texts: List[str]
    stats: BatchStats
    caches: Optional[list] = None
    token_ids: Optional[List[List[int]]] = None
    logprobs: Optional[List[List[float]]] = None
    finish_reasons: List[str] = field(default_factory=list)


@dataclass
class BatchStreamResponse:
    """One row's new token in :func:`stream_batch_generate`."""

    index: int  # which prompt
    token: int
    text: str  # newly final text of that row
    logprob: float
    finish_reason: Optional[str] = None
