"""Checks run where user input enters the generation API.

Every check raises before any work starts, with a one-line message that names the
argument (and prompt or row) and the allowed range. Only documented exception
types leave this module: ``TypeError`` (wrong kind of value), ``ValueError`` (right
kind, out of range) and, from the callers,
``NotImplementedError`` for mlx-lm features this package does not have.

Generation past the model's context (``max_position_embeddings``) is not an error:
``max_tokens`` is capped to what fits and one :class:`ContextLengthWarning` says so.
"""

import warnings
from typing import Optional

import mlx.core as mx

from ..models.context import context_length
from ..sampling.params import is_int


class ContextLengthWarning(UserWarning):
    """``max_tokens`` was cut so that prompt + generation fits the model's context."""


def check_int(name: str, value, lo: int = None, hi: int = None, allow=()):
    """``value`` must be an int in ``[lo, hi]`` (or one of ``allow``); returns it as int.

    Raises ``TypeError`` for non-integers (bools and floats included), ``ValueError``
    when out of range.
    """
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value in allow:
        return value
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        extra = "".join(f" (or {a})" for a in allow)
        raise ValueError(f"{name} must be an integer {rng}{extra}, got {value}")
    return value


def check_optional_int(name: str, value, lo: int, hi: int = None):
    """None, or an int in ``[lo, hi]``."""
    return None if value is None else check_int(name, value, lo, hi)


INT32_MAX = 2**31 - 1  # sizes that reach array shapes or int32 masks


def check_callable(name: str, value, optional=True):
    """``value`` must be callable (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not callable(value):
        raise TypeError(f"{name} must be callable{' or None' if optional else ''}, "
                        f"got {type(value).__name__}")
    return value


def check_processors(value):
    """``logits_processors``: None or an iterable of callables; returns a list."""
    if value is None:
        return []
    if callable(value) or isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"logits_processors must be a list of callables, "
                        f"got {type(value).__name__}")
    value = list(value)
    for i, p in enumerate(value):
        check_callable(f"logits_processors[{i}]", p, optional=False)
    return value


def cached_tokens(prompt_cache) -> int:
    """Positions a prompt cache already holds (0 for None or an empty cache)."""
    if not prompt_cache:
        return 0
    n = getattr(prompt_cache[0], "offset", 0)
    return int(n) if is_int(n) else 0


def cap_max_tokens(model, max_tokens: int, prompt_len: int, start: int = 0, what="prompt"):
    """``max_tokens`` cut so ``start + prompt_len + max_tokens`` fits the context.

    ``-1`` (no limit) is returned unchanged. Raises ``ValueError`` when the prompt
    alone fills the context; warns (:class:`ContextLengthWarning`) when it cuts.
    """
    context = context_length(model)
    if context is None:
        return max_tokens
    room = context - start - prompt_len
    if room < 1:
        cached = f" after {start} cached tokens" if start else ""
        raise ValueError(f"{what} has {prompt_len} tokens{cached}: the model's context "
                         f"(max_position_embeddings) is {context}, so at most "
                         f"{context - start - 1} prompt tokens fit")
    if max_tokens != -1 and max_tokens > room:
        warn_context(f"max_tokens={max_tokens} cut to {room}: {what} ({start + prompt_len} "
                     f"tokens) + max_tokens must fit the model's context of {context}")
        return room
    return max_tokens


def context_room(model, prompt_len: int, start: int = 0) -> Optional[int]:
    """Tokens that can still be generated within the context (None when unbounded)."""
    context = context_length(model)
    return None if context is None else context - start - prompt_len


def warn_context(message: str):
    """One warning line (a :class:`ContextLengthWarning`)."""
    warnings.warn(message, ContextLengthWarning, stacklevel=3)


# Generation arguments
def check_max_tokens(value, allow_unlimited=False):
    """``max_tokens``: an int >= 1 (or -1 = no limit where ``allow_unlimited``)."""
    return check_int("max_tokens", value, 1, allow=(-1,) if allow_unlimited else ())


def per_row_max_tokens(value, n: int):
    """``max_tokens`` of ``batch_generate``: one int for all prompts or one per prompt."""
    if is_int(value):
        return [check_max_tokens(value)] * n
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        raise TypeError(f"max_tokens must be an int or a list of ints, "
                        f"got {type(value).__name__} {value!r}")
    values = list(value)
    if len(values) != n:
        raise ValueError(f"max_tokens has {len(values)} entries for {n} prompts")
    return [check_int(f"max_tokens[{i}]", v, 1) for i, v in enumerate(values)]


def prompt_list(prompts):
    """``prompts`` of ``batch_generate``: a list (or tuple / 2-D array) of prompts."""
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of prompts (strings or token lists), "
                        "got a single string: wrap it in a list")
    if isinstance(prompts, mx.array) or hasattr(prompts, "tolist"):
        prompts = prompts.tolist()
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of strings or token lists, "
                        f"got {type(prompts).__name__}")
    return list(prompts)


def token_list(ids, vocab: Optional[int], where: str):
    """A prompt's token ids as a list of ints in ``[0, vocab)``.

    ``where`` names the prompt in messages (e.g. ``"prompt 3"``). Raises
    ``TypeError`` for non-integer ids, ``ValueError`` for empty prompts and ids
    outside the vocabulary.
    """
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)):
        raise TypeError(f"{where} must be a string or a list of token ids, "
                        f"got {type(ids).__name__}")
    for t in ids:
        if not is_int(t):
            raise TypeError(f"{where} has a token id that is not an int: {t!r}")
    if len(ids) == 0:
        raise ValueError(f"{where} is empty")
    ids = [int(t) for t in ids]
    _check_id_range(min(ids), max(ids), vocab, where)
    return ids


def _check_id_range(lo, hi, vocab, where):
    if lo < 0 or (vocab is not None and hi >= vocab):
        bad = lo if lo < 0 else hi
        rng = f"[0, {vocab})" if vocab is not None else ">= 0"
        raise ValueError(f"{where} has token id {bad}; ids must be in {rng} "
                         f"(the model's vocabulary)")


def prompt_array(prompt, vocab: Optional[int]):
    """``generate_step``'s prompt as an integer ``mx.array`` of shape ``(L,)`` or ``(B, L)``.

    Every id (padding columns included: they go through the embedding too) must
    be in ``[0, vocab)``; the message names the first bad row.
    """
    if isinstance(prompt, (str, bytes)):
        raise TypeError("prompt must be token ids (generate_step does not tokenize; "
                        "use stream_generate or generate for text)")
    if not isinstance(prompt, mx.array):
        try:
            prompt = mx.array(prompt)
        except (ValueError, TypeError, RuntimeError) as e:
            raise TypeError(f"prompt must be an array or a (nested) list of token ids: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if prompt.ndim not in (1, 2):
        raise ValueError(f"prompt must have shape (L,) or (B, L), got {tuple(prompt.shape)}")
    if prompt.size == 0:
        raise ValueError(f"empty prompt: nothing to generate from (shape {tuple(prompt.shape)})")
    if not mx.issubdtype(prompt.dtype, mx.integer):
        raise TypeError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    # Compared in the prompt's own integer dtype (no int64 cast: not every backend has it).
    rows = prompt.reshape(1, -1) if prompt.ndim == 1 else prompt
    if prompt.dtype in (mx.int8, mx.uint8, mx.int16, mx.uint16):
        rows = rows.astype(mx.int32)  # so that ``vocab`` is representable
    bad = (rows < 0) | (rows >= vocab) if vocab is not None else rows < 0
    bad_rows = mx.any(bad, axis=1)
    if bool(mx.any(bad_rows).item()):
        b = int(mx.argmax(bad_rows).item())
        row = rows[b]
        where = "prompt" if prompt.ndim == 1 else f"prompt row {b}"
        _check_id_range(int(row.min().item()), int(row.max().item()), vocab, where)
    return prompt


def left_padding_list(left_padding, batch: int, length: int):
    """``left_padding``: one int per row, ``0 <= pad < length`` (a row keeps >= 1 token)."""
    if left_padding is None:
        return None
    if hasattr(left_padding, "tolist") and not isinstance(left_padding, (list, tuple)):
        left_padding = left_padding.tolist()
    if not isinstance(left_padding, (list, tuple)):
        raise TypeError(f"left_padding must be a list of ints (one per row), "
                        f"got {type(left_padding).__name__}")
    if len(left_padding) != batch:
        raise ValueError(f"left_padding has {len(left_padding)} entries for {batch} prompt rows")
    return [check_int(f"left_padding[{b}]", p, 0, length - 1) for b, p in enumerate(left_padding)]


def unknown_kwargs(function: str, kwargs: dict, allowed):
    """``TypeError`` naming every keyword in ``kwargs`` that ``function`` does not take."""
    extra = sorted(k for k in kwargs if k not in allowed)
    if extra:
        raise TypeError(f"{function}() got unexpected keyword argument(s): {', '.join(extra)}")
