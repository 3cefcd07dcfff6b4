"""mlx-lm's ``mlx_lm.generate``: the generation API, ``BatchGenerator`` and the command
line's names. ``python -m mlx_lm_batched.generate`` runs ``cli/generate.py`` (the entry
first, so that Ctrl-C while MLX loads ends in one line); the names importing it gives
are listed in ``compat/module_table.py``."""

if __name__ == "__main__":
    from .cli.entry import run_generate

    run_generate()

from .compat.reexport import export_names as _export_names

__all__ = _export_names(globals())
