"""``python -m mlx_lm_batched.run_batch -i requests.jsonl -o results.jsonl``: an OpenAI
Batch file run offline with continuous batching, resumable after any kill
(``cli/run_batch.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("run_batch")

from .cli.run_batch import build_parser, main

__all__ = ["build_parser", "main"]
