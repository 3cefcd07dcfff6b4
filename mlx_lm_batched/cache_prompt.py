"""mlx-lm's ``mlx_lm.cache_prompt``: saving a prompt's cache for ``generate
--prompt-cache-file``. ``python -m mlx_lm_batched.cache_prompt`` runs
``cli/cache_prompt.py`` (the entry first, so that Ctrl-C while MLX loads ends in one
line); the names importing it gives are listed in ``compat/module_table.py``."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("cache_prompt")

from .compat.reexport import export_names as _export_names

__all__ = _export_names(globals())
