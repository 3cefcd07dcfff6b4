"""mlx-lm's ``mlx_lm.convert``: ``convert`` (``loading/convert.py``); ``python -m
mlx_lm_batched.convert`` runs its command line (``cli/convert.py``); its parser,
quantization recipes and the loading/saving names mlx-lm's module re-exports."""

from .cli.convert import main
from .cli.convert_args import configure_parser
from .loading.convert import convert
from .loading.dequantize import dequantize_model
from .loading.load import load
from .loading.model_info import upload_to_hub
from .loading.quant_recipes import QUANT_RECIPES, mixed_quant_predicate_builder
from .loading.save import quantize_model, save

__all__ = ["QUANT_RECIPES", "configure_parser", "convert", "dequantize_model", "load", "main",
           "mixed_quant_predicate_builder", "quantize_model", "save", "upload_to_hub"]


if __name__ == "__main__":
    raise SystemExit(main())
