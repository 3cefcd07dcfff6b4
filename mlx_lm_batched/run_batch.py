"""An OpenAI Batch file run offline with continuous batching, resumable after any kill
(``-i requests.jsonl -o results.jsonl``). ``python -m mlx_lm_batched.run_batch`` runs
``cli/run_batch.py`` (the entry first, so that Ctrl-C while MLX loads ends in one line);
the names importing it gives are listed in ``compat/module_table.py``."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("run_batch")

from .compat.reexport import export_names as _export_names

__all__ = _export_names(globals())
