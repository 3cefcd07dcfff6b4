"""Counters and interval statistics of a :class:`~mlx_lm_batched.sched.generator.BatchGenerator`
(the names and fields of ``mlx_lm.generate_utils``).

A generator only ever adds to its ``BatchCounters``; ``BatchGenerator.stats()``
reads them on entry and exit of a ``with`` block and reports the difference as a
``BatchStats``, so nested or overlapping windows each see their own interval.
"""

import time
from dataclasses import dataclass, field

import mlx.core as mx

__all__ = ["BatchCounters", "BatchCountersSnapshot", "BatchStats", "peak_memory_gb"]


def peak_memory_gb():
    """The process's peak memory so far, in GB."""
    return mx.get_peak_memory() / 1e9


@dataclass(kw_only=True)
class BatchCounters:
    """Totals that only grow: prompt tokens and seconds spent prefilling, generated
    tokens, decode steps (one token per decoding row each), seconds decoding, and the
    padding tokens prefill computed besides the prompt tokens."""

    prompt_tokens: int = 0
    prompt_time: float = 0.0
    generation_tokens: int = 0
    generation_steps: int = 0
    decode_time: float = 0.0
    padding_tokens: int = 0

    @property
    def prompt_tps(self):
        """Prompt tokens per second of prefill."""
        return self.prompt_tokens / self.prompt_time if self.prompt_time > 0 else 0.0

    @property
    def decode_tps(self):
        """Generated tokens per second of the decode steps alone."""
        return self.generation_tokens / self.decode_time if self.decode_time > 0 else 0.0


@dataclass(kw_only=True)
class BatchCountersSnapshot(BatchCounters):
    """The counters at one moment, stamped with the time and the peak memory (GB)."""

    measured_at: float = field(default_factory=time.perf_counter)
    peak_memory: float = field(default_factory=peak_memory_gb)

    @staticmethod
    def between(start, end):
        """The :class:`BatchStats` of the work counted from ``start`` to ``end``."""
        return BatchStats(
            prompt_tokens=end.prompt_tokens - start.prompt_tokens,
            prompt_time=end.prompt_time - start.prompt_time,
            generation_tokens=end.generation_tokens - start.generation_tokens,
            generation_steps=end.generation_steps - start.generation_steps,
            decode_time=end.decode_time - start.decode_time,
            padding_tokens=end.padding_tokens - start.padding_tokens,
            wall_time=end.measured_at - start.measured_at,
            peak_memory=max(start.peak_memory, end.peak_memory),  # a high-water mark
        )


@dataclass(kw_only=True)
class BatchStats(BatchCounters):
    """What a generator did over an interval of ``wall_time`` seconds."""

    wall_time: float = 0.0
    peak_memory: float = 0.0

    @property
    def generation_time(self):
        """Seconds of the interval not spent prefilling."""
        return max(0.0, self.wall_time - self.prompt_time)

    @property
    def generation_tps(self):
        return self.generation_tokens / self.generation_time if self.generation_time > 0 else 0.0

    @property
    def overhead_time(self):
        """Seconds spent neither prefilling nor in decode steps."""
        return max(0.0, self.wall_time - self.prompt_time - self.decode_time)

    def __iadd__(self, other):
        for name in ("prompt_tokens", "prompt_time", "generation_tokens", "generation_steps",
                     "decode_time", "padding_tokens", "wall_time"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.peak_memory = max(self.peak_memory, other.peak_memory)
        return self
