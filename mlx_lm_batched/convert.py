"""mlx-lm's ``mlx_lm.convert``: ``convert``, its parser and quantization recipes. ``python
-m mlx_lm_batched.convert`` runs ``cli/convert.py`` (the entry first, so that Ctrl-C
while MLX loads ends in one line); the names importing it gives are listed in
``compat/module_table.py``."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("convert")

from .compat.reexport import export_names as _export_names

__all__ = _export_names(globals())
