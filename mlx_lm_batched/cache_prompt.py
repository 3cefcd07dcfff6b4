"""mlx-lm's ``mlx_lm.cache_prompt``: ``python -m mlx_lm_batched.cache_prompt`` saves a
prompt's cache for ``generate --prompt-cache-file`` (``cli/cache_prompt.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("cache_prompt")

from .api.generate import generate_step
from .cache.factory import make_prompt_cache
from .cache.files import save_prompt_cache
from .cli.cache_prompt import build_parser as setup_arg_parser, main
from .loading.load import load

__all__ = ["generate_step", "load", "main", "make_prompt_cache", "save_prompt_cache",
           "setup_arg_parser"]
