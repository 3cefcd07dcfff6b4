"""The settings of one :class:`~.generator.BatchGenerator`, checked once:
:class:`GeneratorOptions`. ``DEFAULT_QUANTIZED_KV_START`` is the one place that holds
mlx-lm's default of ``quantized_kv_start``."""

from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple

from . import capabilities

# mlx-lm's default: a batch's KV caches are quantized once they hold this many slots.
DEFAULT_QUANTIZED_KV_START = 5000


@dataclass(frozen=True, eq=False)
class GeneratorOptions:
    """Everything a generator keeps for all its rows (mlx-lm 0.32's keywords and ours).

    Row defaults (a row inserted without its own): ``max_tokens``, ``stop_tokens``
    (stop sequences: lists of token ids, or bare ids), ``sampler`` (None: greedy),
    ``logits_processors``. Batch shape: ``completion_batch_size`` rows decode at once
    (at least ``prefill_batch_size``), ``prefill_batch_size`` rows prefill together in
    chunks of ``prefill_step_size`` columns, at most ``prefill_tokens_per_step`` prompt
    tokens per step while rows decode (None: no bound). ``max_kv_size``: rotating caches
    of that many slots. ``return_logprobs`` / ``return_caches``: what responses carry.
    ``kv_bits`` / ``kv_group_size`` / ``quantized_kv_start``: quantized KV caches.
    Speculative decoding: ``draft_model`` or ``prompt_lookup``, ``num_draft_tokens``.

    Raises ``ValueError`` / ``TypeError`` (one line naming the setting) for a bad value
    and the capability table's error for features that do not combine.
    """

    max_tokens: int = 128
    stop_tokens: Any = None
    sampler: Any = None
    logits_processors: Tuple = ()
    completion_batch_size: int = 32
    prefill_batch_size: int = 8
    prefill_step_size: int = 2048
    prefill_tokens_per_step: Optional[int] = None
    max_kv_size: Optional[int] = None
    return_logprobs: bool = True
    return_caches: bool = True
    kv_bits: Optional[int] = None
    kv_group_size: int = 64
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START
    draft_model: Any = None
    num_draft_tokens: int = 2
    prompt_lookup: bool = False

    def __post_init__(self):
        for name in ("completion_batch_size", "prefill_batch_size", "prefill_step_size",
                     "prefill_tokens_per_step"):
            value = getattr(self, name)
            if value is None and name == "prefill_tokens_per_step":
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        object.__setattr__(self, "logits_processors", tuple(self.logits_processors or ()))
        self.kv_quant  # checks kv_bits and kv_group_size
        capabilities.check(self.features)
        if self.speculative:
            from ..engine.speculative import check_num_draft_tokens

            check_num_draft_tokens(self.num_draft_tokens)

    @classmethod
    def of(cls, options=None, **keywords):
        """``options`` (or the defaults) with ``keywords`` replacing its fields; an
        unknown keyword raises ``TypeError`` naming it."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise TypeError(f"unknown generator option(s): {', '.join(unknown)}")
        base = {} if options is None else {f.name: getattr(options, f.name) for f in fields(cls)}
        return cls(**{**base, **keywords})

    @property
    def features(self):
        """The capability-table features these settings use."""
        kv = {"kv_bits"} if self.kv_bits is not None else set()
        return kv | capabilities.speculative_features(self.draft_model, self.prompt_lookup)

    @property
    def speculative(self):
        """Whether rows decode speculatively (a draft model or prompt lookup)."""
        return self.draft_model is not None or bool(self.prompt_lookup)

    @property
    def kv_quant(self):
        """The engine's ``KVQuantization`` of these settings (None: float caches)."""
        from ..engine.batch_engine import KVQuantization

        return KVQuantization.of(self.kv_bits, self.kv_group_size, self.quantized_kv_start)
