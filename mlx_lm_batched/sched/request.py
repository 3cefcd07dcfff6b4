"""One generation request as the scheduler takes it: :class:`Request`, checked once when
it is made. ``BatchGenerator.insert_requests`` queues them; mlx-lm's parallel-list
``insert`` / ``insert_segments`` build them (``sched/admission.py``)."""

from dataclasses import dataclass, field
from typing import Any, Optional, Tuple

from ..cache import row_caches
from ..sampling.stop_sequences import StopSequences


@dataclass(frozen=True, eq=False)
class Request:
    """A prompt and everything that shapes its row's output.

    ``segments``: the prompt's token ids as one or more segments (prefill reports each
    segment end, where the row's cache can be extracted); ``Request.of(tokens)`` for one.
    ``cache`` (a prompt cache, or None) holds ``cached_tokens``; the prompt continues it.
    Left None, ``max_tokens``, ``sampler``, ``logits_processors`` and ``stop_sequences``
    are the generator's (its :class:`~.options.GeneratorOptions`); ``logits_processors=()``
    is none. ``seed`` (an int): the row samples from its own key stream.
    ``prompt_logprobs`` (an int k >= 0): score the prompt with the k most likely tokens.
    ``adapter``: the adapter slot (None: the model's default). ``label`` names the
    request in error messages.

    Raises ``ValueError`` (``TypeError`` for a cache that is not one) naming the problem.
    """

    segments: Tuple[Tuple[int, ...], ...]
    max_tokens: Optional[int] = None
    cache: Optional[Any] = None
    cached_tokens: Tuple[int, ...] = ()
    sampler: Any = None
    logits_processors: Optional[Tuple] = None
    stop_sequences: Optional[StopSequences] = None
    seed: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    adapter: Optional[int] = None
    label: str = field(default="the request", repr=False)
    cache_label: str = field(default="cache", repr=False)

    def __post_init__(self):
        segs = tuple(tuple(int(t) for t in s) for s in self.segments if len(s))
        if not segs:
            raise ValueError(f"{self.label} is empty: nothing to generate from")
        object.__setattr__(self, "segments", segs)
        object.__setattr__(self, "cached_tokens", tuple(int(t) for t in self.cached_tokens or ()))
        if self.cache is not None:
            row_caches.check_cache(self.cache, self.cache_label)
        if self.max_tokens is not None:
            check_max_tokens(self.max_tokens, self.label)
        top = self.prompt_logprobs
        if top is not None and (not isinstance(top, int) or top < 0):
            raise ValueError(f"prompt_logprobs of {self.label} must be None or an int "
                             f">= 0, got {top!r}")
        if self.logits_processors is not None:
            object.__setattr__(self, "logits_processors", tuple(self.logits_processors))
        stops = self.stop_sequences
        if stops is not None and not hasattr(stops, "matcher"):  # sequences, not a matcher
            object.__setattr__(self, "stop_sequences", StopSequences(stops))

    @classmethod
    def of(cls, tokens, **fields):
        """A request for one prompt of token ids (one segment)."""
        return cls((tokens,), **fields)

    @property
    def prompt(self):
        """All the prompt's token ids."""
        return [t for s in self.segments for t in s]


def check_max_tokens(max_tokens, label):
    """``max_tokens`` of a request must be > 0 (ValueError naming ``label``)."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens of {label} must be > 0, got {max_tokens}")
