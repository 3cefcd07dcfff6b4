"""mlx-lm's ``mlx_lm.benchmark``: ``python -m mlx_lm_batched.benchmark`` measures prompt and
generation tokens/s and peak memory per batch size (``cli/benchmark.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("benchmark")

from .api.batch import batch_generate
from .api.generate import stream_generate
from .cli.benchmark import build_parser as setup_arg_parser, main
from .loading.load import load
from .parallel.load import sharded_load

__all__ = ["batch_generate", "load", "main", "setup_arg_parser", "sharded_load",
           "stream_generate"]
