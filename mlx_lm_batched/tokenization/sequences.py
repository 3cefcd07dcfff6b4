"""Token-sequence helpers of mlx-lm's ``tokenizer_utils``."""


def no_bos_or_eos(sequence, bos, eos):
    """``sequence`` without a leading ``bos`` and a trailing ``eos`` (each only when
    present)."""
    start = 1 if sequence[0] == bos else 0
    rest = sequence[start:]
    return rest[:-1] if rest[-1] == eos else rest
