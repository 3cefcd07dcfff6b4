"""mlx-lm's ``mlx_lm.generate_utils``: a ``BatchGenerator``'s counters and interval
statistics (``sched/stats.py``)."""

from .sched.stats import BatchCounters, BatchCountersSnapshot, BatchStats

__all__ = ["BatchCounters", "BatchCountersSnapshot", "BatchStats"]
