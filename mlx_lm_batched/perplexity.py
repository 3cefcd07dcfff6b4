"""mlx-lm's ``mlx_lm.perplexity``: ``python -m mlx_lm_batched.perplexity`` evaluates a
model's perplexity on a local dataset (``cli/perplexity.py``, ``api/perplexity.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("perplexity")

from .api.perplexity import eval_ppl, load_data
from .cli.perplexity import build_parser, main
from .loading.load import load
from .loading.save import get_total_parameters

__all__ = ["build_parser", "eval_ppl", "get_total_parameters", "load", "load_data", "main"]
