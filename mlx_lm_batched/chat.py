"""mlx-lm's ``mlx_lm.chat``: ``python -m mlx_lm_batched.chat`` runs the chat REPL
(``cli/chat.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("chat")

from .api.generate import stream_generate
from .cache.factory import make_prompt_cache
from .cli.chat import build_parser as setup_arg_parser, main
from .loading.load import load
from .parallel.load import sharded_load
from .sampling.samplers import make_sampler

__all__ = ["load", "main", "make_prompt_cache", "make_sampler", "setup_arg_parser",
           "sharded_load", "stream_generate"]
