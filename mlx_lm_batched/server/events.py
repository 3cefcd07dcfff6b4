"""What the engine and the HTTP side exchange: the engine's settings, a request as the
engine thread holds it (:class:`Job`), and the events it sends to the request's asyncio
queue (:class:`Started`, :class:`Delta`, :class:`Finished`, :class:`Failed`)."""

import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

from .errors import APIError
from .row_state import RowState


@dataclass
class EngineConfig:
    """Engine settings (the server's flags)."""

    max_batch: int = 64  # rows decoding at once
    prefill_batch: int = 8  # rows prefilled together
    prefill_step_size: int = 2048
    prefill_tokens_per_step: Optional[int] = None  # prompt tokens per step while rows decode
    default_max_tokens: int = 512  # when a request gives none (bounded by the context)
    context_length: Optional[int] = None  # None: the model's (models.context.context_length)
    max_kv_bytes: Optional[int] = None  # KV admitted requests reserve in all; None: no bound
    max_waiting: int = 256  # requests admitted but not started; more -> 429
    prompt_cache_size: int = 10  # prefix-cache entries (0: off)
    prompt_cache_bytes: int = 1 << 30  # the prefix cache's (or KV block store's) memory bound
    kv_block_size: int = 32  # tokens per shared KV block (models with plain KV caches)
    kv_disk_dir: Optional[str] = None  # the KV blocks' disk tier (None: memory only)
    kv_disk_bytes: int = 8 << 30  # bound of the disk tier
    kv_bits: Optional[int] = None  # quantized KV caches (None: float)
    kv_group_size: int = 64
    quantized_kv_start: int = 0  # slots after which a batch's caches are quantized
    kv_growth_tokens: int = 256  # slots a row reserves ahead (0: prompt + max_tokens, no preemption)
    num_draft_tokens: int = 3  # speculative decoding (with a draft model or prompt_lookup)
    prompt_lookup: bool = False  # draft from n-grams of each row's own tokens


@dataclass
class Started:
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Delta:
    index: int
    text: str
    logprobs: list  # [(token id, token text, logprob, [(id, text, logprob), ...])]


@dataclass
class Finished:
    index: int
    finish_reason: str
    completion_tokens: int


@dataclass
class Failed:
    error: APIError


@dataclass(eq=False)
class Job:
    """One request: its spec, its asyncio queue of events, and its rows once started."""

    spec: Any  # JobSpec (job_prep)
    queue: Any
    loop: Any
    id: int = 0
    arrival: float = field(default_factory=time.monotonic)
    rows: List[RowState] = field(default_factory=list)
    reserved: int = 0  # KV bytes its rows reserve (server/kv_admission.py)
    grants: list = field(default_factory=list)  # their KVGrants: per prompt, then per row
    suspended: List[RowState] = field(default_factory=list)  # rows preempted, to resume
    waiting: bool = True
    cancelled: bool = False

    @property
    def scores_prompt(self):
        """Echo with logprobs: its rows prefill the whole prompt for its scores (no
        prefix reuse)."""
        params = self.spec.params
        return bool(getattr(params, "echo", False) and getattr(params, "logprobs", None))

    @property
    def preemptible(self):
        """False for a request scoring its prompt: a resume would prefill tokens the
        scores were already sent for, so it reserves all it needs."""
        return not self.scores_prompt

    def send(self, event):
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass
