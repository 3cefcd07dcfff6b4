"""Checks the layers' small frozen parts (their widths) run once when they are made."""

from dataclasses import fields


def require_positive_integers(part):
    """Raise ValueError naming the first field of the dataclass ``part`` that is not a
    positive ``int`` (a bool is not one)."""
    for field in fields(part):
        value = getattr(part, field.name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(part).__name__} {field.name} must be a positive "
                             f"integer, got {value!r}")
