"""mlx-lm's ``utils._parse_size``: a size such as ``"4.1GB"`` in bytes (decimal units)."""

from decimal import Decimal, InvalidOperation

_UNITS = {"": 1, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9}


def parse_size(text):
    """``"1024"`` -> 1024, ``"512M"`` -> 512_000_000, ``"2.7GB"`` -> 2_700_000_000;
    ValueError naming the text otherwise."""
    digits = len(text) - len(text.lstrip("0123456789."))
    unit = text[digits:].strip().upper()
    try:
        if unit not in _UNITS:
            raise InvalidOperation
        return int(Decimal(text[:digits]) * _UNITS[unit])
    except InvalidOperation:
        raise ValueError(f"not a size: {text!r} (a number with M, MB, G or GB)") from None
