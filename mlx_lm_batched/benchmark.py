"""mlx-lm's ``mlx_lm.benchmark``: ``python -m mlx_lm_batched.benchmark`` measures prompt and
generation tokens/s and peak memory per batch size (``cli/benchmark.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("benchmark")

from .cli.benchmark import build_parser as setup_arg_parser, main

__all__ = ["main", "setup_arg_parser"]
