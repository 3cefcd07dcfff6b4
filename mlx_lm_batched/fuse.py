"""mlx-lm's ``mlx_lm.fuse``: ``python -m mlx_lm_batched.fuse`` folds an adapter into a
model's weights (``cli/fuse.py``, ``loading/adapters.fuse_adapters``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("fuse")

from .cli.fuse import build_parser as parse_arguments, main

__all__ = ["main", "parse_arguments"]
