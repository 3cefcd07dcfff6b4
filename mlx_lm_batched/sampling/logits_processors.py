"""Batched logits processors (``make_logits_processors``, mlx-lm's signature).

Each processor is ``processor(tokens, logits) -> logits`` on a whole batch: token
histories ``(B, T)`` (negative ids are left padding) or ``(T,)``, logits ``(B, V)``.
Also importable from ``sample_utils``, as in mlx-lm.
"""

import math
from typing import Callable, Dict, List, Optional, Sequence, Union

import mlx.core as mx

from .params import as_2d as _as_2d
from .params import check_rows as _check_rows
from .params import int_checker as _check_int
from .params import real_checker as _check_real
from .params import row_param as _param

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
RowParam = Union[float, int, Sequence, mx.array]


# Logits processors: processor(tokens (B, T) | (T,), logits (B, V)) -> logits
def _token_counts(tokens, vocab: int, batch: int, context_size: Optional[int]):
    """``(B, V)`` float32 count of each id in the last ``context_size`` tokens.

    Negative ids (left-padding) and ids >= vocab are ignored.
    """
    toks = tokens if isinstance(tokens, mx.array) else mx.array(tokens)
    toks = toks[None] if toks.ndim == 1 else toks
    if toks.shape[0] != batch:
        raise ValueError(
            f"tokens has {toks.shape[0]} rows but logits has {batch} rows"
        )
    if context_size is not None:
        toks = toks[:, -context_size:]
    if toks.size == 0:
        return None
    toks = toks.astype(mx.int32)  # pads stored as uint32 wrap to -1 here too
    valid = (toks >= 0) & (toks < vocab)
    # Flat scatter-add: duplicates accumulate, pads add 0 at a dummy slot.
    flat = mx.arange(batch, dtype=mx.int32)[:, None] * vocab + mx.where(valid, toks, 0)
    counts = mx.zeros((batch * vocab,), mx.float32)
    counts = counts.at[flat.reshape(-1)].add(valid.reshape(-1).astype(mx.float32))
    return counts.reshape(batch, vocab)


def _penalty_processor(kind: str, penalty, context_size: Optional[int]):
    def processor(tokens, logits: mx.array) -> mx.array:
        x, squeeze = _as_2d(logits)
        _check_rows(f"{kind}_penalty", penalty, x.shape[0])
        counts = _token_counts(tokens, x.shape[-1], x.shape[0], context_size)
        if counts is None:
            return logits
        if kind == "repetition":
            # HF / CTRL: once per distinct id; shrink positive logits, grow negative.
            p = mx.where(penalty == 0, 1.0, penalty) if isinstance(penalty, mx.array) else penalty
            hit = mx.where(x < 0, x * p, x / p)
            out = mx.where(counts > 0, hit, x)
        elif kind == "presence":
            out = x - penalty * (counts > 0)
        else:  # frequency: proportional to the number of occurrences
            out = x - penalty * counts
        out = out.astype(x.dtype)
        return out[0] if squeeze else out

    return processor


def make_logits_processors(
    logit_bias: Optional[Dict[int, float]] = None,
    repetition_penalty: Optional[RowParam] = None,
    repetition_context_size: Optional[int] = 20,
    presence_penalty: Optional[RowParam] = None,
    presence_context_size: Optional[int] = 20,
    frequency_penalty: Optional[RowParam] = None,
    frequency_context_size: Optional[int] = 20,
) -> List[LogitsProcessor]:
    """Make batched logits processors (same signature as mlx-lm 0.32.2).

    Each processor is ``processor(tokens, logits) -> logits`` with ``tokens``
    ``(B, T)`` (right-aligned history per row, prompt included; negative ids
    are padding and ignored) or ``(T,)``, and ``logits`` ``(B, V)``. Penalties
    only look at the last ``*_context_size`` tokens (``None`` = all):

    - ``logit_bias``: ``{token_id: bias}`` added to every row; ids must be in
      ``[0, vocab)`` (checked when the processor first sees logits, since the
      vocabulary is not known here).
    - ``repetition_penalty`` (>= 0): each distinct id in context has positive
      logits divided and negative logits multiplied by the penalty.
    - ``presence_penalty``: subtracted once per distinct id in context.
    - ``frequency_penalty``: subtracted once per occurrence in context.

    Penalties may be a scalar or one value per row; ``None``/0 disables them.
    Raises ``ValueError`` for out-of-range or wrongly typed values.
    """
    processors: List[LogitsProcessor] = []
    if logit_bias is not None and not isinstance(logit_bias, dict):
        raise ValueError(f"logit_bias must be a dict {{token_id: bias}}, "
                         f"got {type(logit_bias).__name__}")
    if logit_bias:
        for tok, bias in logit_bias.items():
            # int32 bound: the ids become an int32 index array.
            _check_int("logit_bias token id", 0, 2**31 - 1)(tok)
            _check_real("logit_bias value", -math.inf, math.inf, finite=True)(bias)
        ids = mx.array([int(t) for t in logit_bias], dtype=mx.int32)
        biases = mx.array([float(b) for b in logit_bias.values()], dtype=mx.float32)
        top_id = max(int(t) for t in logit_bias)

        def logit_bias_processor(_tokens, logits: mx.array) -> mx.array:
            # The vocabulary is known only now; an id past it would write out of bounds.
            if top_id >= logits.shape[-1]:
                raise ValueError(f"logit_bias token id {top_id} is outside the model's "
                                 f"vocabulary [0, {logits.shape[-1]})")
            return logits.at[..., ids].add(biases.astype(logits.dtype))

        processors.append(logit_bias_processor)

    specs = [
        ("repetition", repetition_penalty, repetition_context_size, 0.0),
        ("presence", presence_penalty, presence_context_size, -math.inf),
        ("frequency", frequency_penalty, frequency_context_size, -math.inf),
    ]
    for kind, penalty, context_size, lo in specs:
        if context_size is not None:
            _check_int(f"{kind}_context_size", 1)(context_size)
        if penalty is None:
            continue
        penalty = _param(
            f"{kind}_penalty", penalty,
            _check_real(f"{kind}_penalty", lo, math.inf, finite=True),
        )
        if isinstance(penalty, mx.array) or penalty != 0:
            processors.append(_penalty_processor(kind, penalty, context_size))
    return processors


def _one_penalty(kind: str, penalty, context_size: int, lo: float) -> LogitsProcessor:
    _check_int(f"{kind} context_size", 1)(context_size)
    penalty = _param(f"{kind} penalty", penalty,
                     _check_real(f"{kind} penalty", lo, math.inf, finite=True))
    return _penalty_processor(kind, penalty, context_size)


def make_repetition_penalty(penalty: RowParam, context_size: int = 20) -> LogitsProcessor:
    """Repetition penalty processor (mlx-lm's name): each distinct id among the last
    ``context_size`` tokens has its positive logits divided and negative logits
    multiplied by ``penalty`` (>= 0; one value or one per row). Batched ``(B, V)``
    logits with ``(B, T)`` histories, or mlx-lm's ``(T,)`` history with ``(1, V)``."""
    return _one_penalty("repetition", penalty, context_size, 0.0)


def make_presence_penalty(penalty: RowParam, context_size: int = 20) -> LogitsProcessor:
    """Presence penalty processor (mlx-lm's name): ``penalty`` is subtracted once from
    the logit of each distinct id among the last ``context_size`` tokens."""
    return _one_penalty("presence", penalty, context_size, -math.inf)


def make_frequency_penalty(penalty: RowParam, context_size: int = 20) -> LogitsProcessor:
    """Frequency penalty processor (mlx-lm's name): ``penalty`` is subtracted from each
    id's logit once per occurrence among the last ``context_size`` tokens."""
    return _one_penalty("frequency", penalty, context_size, -math.inf)


def make_min_tokens_processor(stop_ids, min_tokens: int) -> LogitsProcessor:
    """A per-row processor that forbids ``stop_ids`` (end-of-sequence and stop tokens)
    for the row's first ``min_tokens`` generated tokens (vLLM's ``min_tokens``).

    It counts its own calls (one per generated token), so give each row its own.
    """
    ids = sorted({int(t) for t in stop_ids})
    calls = [0]

    def processor(tokens, logits: mx.array) -> mx.array:
        calls[0] += 1
        if calls[0] > min_tokens or not ids:
            return logits
        vocab = logits.shape[-1]
        banned = mx.zeros((vocab,), mx.bool_)
        banned[mx.array([i for i in ids if i < vocab], dtype=mx.int32)] = True
        return mx.where(banned, -math.inf, logits).astype(logits.dtype)

    return processor
