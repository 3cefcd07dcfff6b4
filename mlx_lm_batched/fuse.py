"""mlx-lm's ``mlx_lm.fuse``: ``python -m mlx_lm_batched.fuse`` folds an adapter into a
model's weights (``cli/fuse.py``, ``loading/adapters.fuse_adapters``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("fuse")

from .cli.fuse import build_parser as parse_arguments, main
from .loading.dequantize import dequantize_model
from .loading.gguf_write import convert_to_gguf
from .loading.load import load
from .loading.model_info import upload_to_hub
from .loading.save import save

__all__ = ["convert_to_gguf", "dequantize_model", "load", "main", "parse_arguments", "save",
           "upload_to_hub"]
