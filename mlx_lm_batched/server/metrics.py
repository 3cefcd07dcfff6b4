"""Server metrics in the Prometheus text format (``GET /metrics``).

The engine thread writes (token counts, row gauges, memory), the event loop writes
request outcomes, ``render`` reads: one lock keeps them consistent. Rates are over the
last ``window`` seconds.
"""

import threading
import time
from collections import deque

PREFIX = "mlx_lm_batched_"
QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Counters, gauges and the queue-time histogram of one server."""

    def __init__(self, window=10.0):
        self.window = window
        self._lock = threading.Lock()
        self._events = deque()  # (time, prompt tokens, generation tokens)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.preemptions = 0
        self.gauges = {"running_rows": 0, "waiting_rows": 0, "waiting_requests": 0,
                       "kv_cache_bytes": 0, "prefix_cache_bytes": 0, "memory_active_bytes": 0,
                       "memory_peak_bytes": 0, "memory_cache_bytes": 0, "memory_resident_bytes": 0,
                       "kv_reserved_bytes": 0, "kv_budget_bytes": 0, "kv_waiting_requests": 0}
        self._queue_counts = [0] * (len(QUEUE_BUCKETS) + 1)
        self._queue_sum = 0.0
        self._requests = {}  # (endpoint, status) -> count

    def add_tokens(self, prompt=0, generation=0, cached=0):
        """Count processed prompt tokens, generated tokens, prompt tokens from the prefix cache."""
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generation
            self.cached_tokens += cached
            self._events.append((time.monotonic(), prompt, generation))

    def count_preemption(self):
        """A request's rows left the batch for KV memory (they resume later)."""
        with self._lock:
            self.preemptions += 1

    def set_gauges(self, **values):
        """Set gauges by name (see ``self.gauges``)."""
        with self._lock:
            self.gauges.update(values)

    def observe_queue_time(self, seconds):
        """A row waited ``seconds`` from its request's arrival to its first prefill."""
        with self._lock:
            i = next((i for i, b in enumerate(QUEUE_BUCKETS) if seconds <= b), len(QUEUE_BUCKETS))
            self._queue_counts[i] += 1
            self._queue_sum += seconds

    def count_request(self, endpoint, status):
        """One answered request of ``endpoint`` with HTTP ``status``."""
        with self._lock:
            key = (endpoint, int(status))
            self._requests[key] = self._requests.get(key, 0) + 1

    def _rates(self):
        now = time.monotonic()
        while self._events and self._events[0][0] < now - self.window:
            self._events.popleft()
        prompt = sum(e[1] for e in self._events)
        gen = sum(e[2] for e in self._events)
        return prompt / self.window, gen / self.window

    def render(self):
        """The Prometheus exposition text."""
        with self._lock:
            prompt_rate, gen_rate = self._rates()
            lines = []

            def metric(name, kind, help_text, samples):
                lines.append(f"# HELP {PREFIX}{name} {help_text}")
                lines.append(f"# TYPE {PREFIX}{name} {kind}")
                for labels, value in samples:
                    lines.append(f"{PREFIX}{name}{labels} {value}")

            g = self.gauges
            metric("running_rows", "gauge", "Rows prefilling or decoding.", [("", g["running_rows"])])
            metric("waiting_rows", "gauge", "Rows waiting for their first prefill.",
                   [("", g["waiting_rows"])])
            metric("waiting_requests", "gauge", "Requests admitted whose rows have not started.",
                   [("", g["waiting_requests"])])
            metric("prompt_tokens_total", "counter", "Prompt tokens prefilled.",
                   [("", self.prompt_tokens)])
            metric("prompt_cached_tokens_total", "counter", "Prompt tokens taken from the prefix cache.",
                   [("", self.cached_tokens)])
            metric("generation_tokens_total", "counter", "Tokens generated.",
                   [("", self.generation_tokens)])
            metric("preemptions_total", "counter",
                   "Requests whose rows left the batch for KV memory, to resume later.",
                   [("", self.preemptions)])
            metric("prompt_tokens_per_second", "gauge",
                   f"Prompt tokens prefilled per second over the last {self.window:g} s.",
                   [("", round(prompt_rate, 3))])
            metric("generation_tokens_per_second", "gauge",
                   f"Tokens generated per second over the last {self.window:g} s.",
                   [("", round(gen_rate, 3))])
            metric("kv_cache_bytes", "gauge", "Bytes of KV cache held by running and waiting rows.",
                   [("", g["kv_cache_bytes"])])
            metric("kv_reserved_bytes", "gauge",
                   "KV bytes reserved by running requests (their tokens and the next --kv-growth-tokens).",
                   [("", g["kv_reserved_bytes"])])
            metric("kv_budget_bytes", "gauge",
                   "KV bytes admitted requests may reserve in all (--kv-memory; 0: no bound).",
                   [("", g["kv_budget_bytes"])])
            metric("kv_waiting_requests", "gauge",
                   "Requests waiting for KV memory that running requests hold.",
                   [("", g["kv_waiting_requests"])])
            metric("prefix_cache_bytes", "gauge", "Bytes held by the prefix (prompt) cache.",
                   [("", g["prefix_cache_bytes"])])
            metric("memory_active_bytes", "gauge", "MLX active memory.",
                   [("", g["memory_active_bytes"])])
            metric("memory_peak_bytes", "gauge", "MLX peak active memory since the start.",
                   [("", g["memory_peak_bytes"])])
            # What the process holds beyond the arrays: MLX's cache of freed buffers, and
            # its whole resident size (the rest is code, Python and freed heap).
            metric("memory_cache_bytes", "gauge", "MLX cache memory (freed buffers kept for reuse).",
                   [("", g["memory_cache_bytes"])])
            metric("memory_resident_bytes", "gauge",
                   "The server process's resident memory (0 where /proc is not there).",
                   [("", g["memory_resident_bytes"])])
            lines.extend(block_store_lines(g))
            buckets, acc = [], 0
            for bound, count in zip(QUEUE_BUCKETS + ("+Inf",), self._queue_counts):
                acc += count
                buckets.append((f'_bucket{{le="{bound}"}}', acc))
            lines.append(f"# HELP {PREFIX}queue_time_seconds Time from arrival to first prefill.")
            lines.append(f"# TYPE {PREFIX}queue_time_seconds histogram")
            for labels, value in buckets:
                lines.append(f"{PREFIX}queue_time_seconds{labels} {value}")
            lines.append(f"{PREFIX}queue_time_seconds_sum {round(self._queue_sum, 6)}")
            lines.append(f"{PREFIX}queue_time_seconds_count {acc}")
            metric("requests_total", "counter", "Answered requests by endpoint and status.",
                   [(f'{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in sorted(self._requests.items())])
            return "\n".join(lines) + "\n"


# The KV block store's gauges and counters (``cache/kv_blocks.py``, ``cache/kv_disk.py``):
# (gauge key, metric name, kind, help). Rendered when the engine reports them.
BLOCK_METRICS = (
    ("blocks_in_use", "kv_blocks_in_use", "gauge", "KV blocks pinned by running rows."),
    ("blocks_cached", "kv_blocks_cached", "gauge", "KV blocks in memory that no row pins."),
    ("block_bytes", "kv_blocks_bytes", "gauge", "Bytes of the KV blocks held in memory."),
    ("block_bytes_bound", "kv_blocks_bytes_bound", "gauge", "Memory bound of the KV blocks."),
    ("disk_blocks", "kv_blocks_on_disk", "gauge", "KV block files in the disk tier."),
    ("disk_bytes", "kv_blocks_disk_bytes", "gauge", "Bytes of the disk tier's block files."),
    ("disk_write_queue_bytes", "kv_blocks_disk_write_queue_bytes", "gauge",
     "Bytes of KV blocks queued for the disk tier's writer (not on disk yet)."),
    ("disk_skipped", "kv_blocks_disk_skipped_total", "counter",
     "Disk-tier files refused on read (corrupt, truncated or foreign)."),
)


def block_store_lines(gauges):
    """Prometheus lines of the block store's values in ``gauges`` (none without a store)."""
    lines = []
    for key, name, kind, help_text in BLOCK_METRICS:
        if key in gauges:
            lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}",
                      f"{PREFIX}{name} {gauges[key]}"]
    if "hit_tokens_memory" in gauges:
        name = f"{PREFIX}prefix_hit_tokens_total"
        lines += [f"# HELP {name} Prompt tokens reused from KV blocks, by where they were.",
                  f"# TYPE {name} counter",
                  f'{name}{{source="memory"}} {gauges["hit_tokens_memory"]}',
                  f'{name}{{source="disk"}} {gauges["hit_tokens_disk"]}']
    return lines


def parse_metrics(text):
    """``{name(with labels): float}`` of a Prometheus text (for tests and scripts)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
