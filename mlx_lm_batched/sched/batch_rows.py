"""The records of :class:`~mlx_lm_batched.sched.generator.BatchGenerator`: the responses it
returns (the fields of mlx-lm's) and the rows and batches it keeps."""

from dataclasses import dataclass
from typing import Any, List, Optional

import mlx.core as mx

from ..cache import row_caches
from ..engine.speculative import SpeculativeEngine


@dataclass
class PromptResponse:
    """Prefill progress of one row: ``progress`` is ``(tokens done, total)``. A row
    inserted with ``prompt_logprobs`` gets, at the end of its prompt, one
    ``(logprob, [(id, logprob), ...])`` per prompt token after the first."""

    uid: int
    progress: tuple
    end_of_segment: bool
    end_of_prompt: bool
    prompt_logprobs: Optional[list] = None


@dataclass
class Response:
    """One generated token of one row. A finished row (``finish_reason`` "stop" or
    "length") also carries its prompt cache and all the tokens in it."""

    uid: int
    token: int
    logprobs: Optional[mx.array]
    finish_reason: Optional[str]
    prompt_cache: Optional[List[Any]]
    all_tokens: Optional[List[int]]


@dataclass(eq=False)
class Row:
    """One request as the scheduler tracks it (its sampling state lives in the engine)."""

    uid: int
    prompt: List[int]  # the tokens to prefill
    boundaries: List[int]  # prompt lengths at which a segment ends
    max_tokens: int
    cache: Optional[list]  # prompt cache given at insert (None: start empty)
    tokens: List[int]  # tokens in the row's cache so far
    sampling: Any  # its engine.sampling.RowSampler
    matcher: Any
    cut_at_segments: bool = False  # prefill stops at every segment end
    prompt_logprobs: Optional[int] = None  # score the prompt, with this many alternatives
    adapter: int = -1  # adapter slot (layers.lora; -1: the model's default)
    done: int = 0  # prompt tokens fed
    generated: int = 0


@dataclass(eq=False)
class Batch:
    """Rows on one engine: a prefill (``job`` running) or the decode batch (``pending``:
    the queued ``(tokens, logprobs)`` of their next step). ``dead``: rows that finished
    or were removed but still occupy the engine until dropping them pays."""

    engine: Any
    job: Any = None
    pending: Optional[tuple] = None
    dead: Optional[set] = None

    def __post_init__(self):
        self.dead = set() if self.dead is None else self.dead

    @property
    def uids(self):
        return self.engine.row_ids

    @property
    def live(self):
        return len(self.engine.row_ids) - len(self.dead)

    def extract(self, i, row, views=False):
        """Row ``i``'s cache, holding exactly ``row.tokens``: a speculative step has fed
        the drafts it kept before reporting them (and past where a row ends). ``views``:
        see ``cache.row_caches.extract_row``."""
        cache = self.engine.extract_row(i, views)
        if isinstance(self.engine, SpeculativeEngine):
            row_caches.trim_to(cache, len(row.tokens))
        return cache

    def drop_dead(self, pending):
        """Filter the dead rows out of the engine and out of ``pending`` (a queued step);
        returns the filtered step."""
        keep = [i for i, uid in enumerate(self.uids) if uid not in self.dead]
        self.engine.filter(keep)
        self.dead.clear()
        idx = mx.array(keep, dtype=mx.int32)
        # A speculative step's third part lists each row's kept drafts.
        return tuple(None if x is None else [x[i] for i in keep] if isinstance(x, list)
                     else x[idx] for x in pending)

    def join(self, other, first_step):
        """Append the rows of ``other`` (a finished prefill, its dead rows dropped) to
        this decode batch: its engine's rows and caches, and ``first_step``, the queued
        ``(tokens, logprobs, ...)`` of their first step, after this batch's ``pending``."""
        if self.dead:
            self.pending = self.drop_dead(self.pending)
        self.engine.extend(other.engine)
        y, logprobs = self.pending[:2]
        self.pending = (mx.concatenate([y, first_step[0].astype(y.dtype)]),
                        None if logprobs is None else mx.concatenate(
                            [logprobs, first_step[1].astype(logprobs.dtype)]),
                        *[a + b for a, b in zip(self.pending[2:], first_step[2:])])
