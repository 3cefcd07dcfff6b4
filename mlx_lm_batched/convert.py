"""mlx-lm's ``mlx_lm.convert``: ``convert`` (``loading/convert.py``); ``python -m
mlx_lm_batched.convert`` runs its command line (``cli/convert.py``)."""

from .cli.convert import main
from .loading.convert import convert

__all__ = ["convert", "main"]


if __name__ == "__main__":
    raise SystemExit(main())
