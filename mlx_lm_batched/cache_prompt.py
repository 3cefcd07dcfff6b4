"""mlx-lm's ``mlx_lm.cache_prompt``: ``python -m mlx_lm_batched.cache_prompt`` saves a
prompt's cache for ``generate --prompt-cache-file`` (``cli/cache_prompt.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("cache_prompt")

from .cli.cache_prompt import build_parser as setup_arg_parser, main

__all__ = ["main", "setup_arg_parser"]
