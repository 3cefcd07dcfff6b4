"""The records of :class:`~mlx_lm_batched.scheduler.BatchGenerator`: the responses it
returns (the fields of mlx-lm's) and the rows and prefill groups it keeps."""

from dataclasses import dataclass, field
from typing import Any, List, Optional

import mlx.core as mx

from .batching import BatchEngine
from .row_sampling import RowOps, TokenContext


@dataclass
class PromptResponse:
    """Prefill progress of one row: ``progress`` is ``(tokens done, total)``."""

    uid: int
    progress: tuple
    end_of_segment: bool
    end_of_prompt: bool


@dataclass
class Response:
    """One generated token of one row. A finished row (``finish_reason`` "stop" or
    "length") also carries its prompt cache and all the tokens in it."""

    uid: int
    token: int
    logprobs: mx.array
    finish_reason: Optional[str]
    prompt_cache: Optional[List[Any]]
    all_tokens: Optional[List[int]]


@dataclass(eq=False)
class Row:
    """One request as the scheduler tracks it."""

    uid: int
    prompt: List[int]  # the tokens to prefill
    boundaries: List[int]  # prompt lengths at which a segment ends
    max_tokens: int
    cache: Optional[list]  # prompt cache given at insert (None: start empty)
    tokens: List[int]  # tokens in the row's cache so far
    sampler: Any
    logits_processors: tuple
    matcher: Any
    cut_at_segments: bool = False  # prefill stops at every segment end
    done: int = 0  # prompt tokens fed
    generated: int = 0
    context: Optional[TokenContext] = None


@dataclass(eq=False)
class RowGroup:
    """Rows prefilled together: left-padded ``(B, L)`` tokens on one engine."""

    rows: list
    engine: BatchEngine
    ops: RowOps
    tokens: mx.array
    padding: List[int]
    col: int = 0  # next column to feed
    cuts: List[int] = field(default_factory=list)  # columns where a chunk must end
