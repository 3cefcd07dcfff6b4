"""mlx-lm's ``convert.configure_parser``: the converter's flags, whose parsed values
``convert(**vars(args))`` takes."""

import argparse

from ..loading.convert import DTYPES
from ..loading.quant_recipes import QUANT_RECIPES


def configure_parser():
    """The argument parser of ``python -m mlx_lm.convert``: mlx-lm's flags, which this
    package's ``convert`` honours (``--upload-repo`` refused with one line)."""
    parser = argparse.ArgumentParser(description="Convert Hugging Face model to MLX format")
    parser.add_argument("--hf-path", "--model", type=str,
                        help="Local path, Hugging Face repo id or .gguf file.")
    parser.add_argument("--mlx-path", type=str, default="mlx_model",
                        help="Path to save the MLX model.")
    parser.add_argument("-q", "--quantize", action="store_true", help="Quantize the model.")
    parser.add_argument("--q-group-size", type=int, default=None, help="Quantization group size.")
    parser.add_argument("--q-bits", type=int, default=None, help="Bits per quantized weight.")
    parser.add_argument("--q-mode", type=str, default="affine",
                        choices=["affine", "mxfp4", "nvfp4", "mxfp8"], help="Quantization mode.")
    parser.add_argument("--dtype", type=str, choices=list(DTYPES), default=None,
                        help="Float type of the parameters that are not quantized.")
    parser.add_argument("--upload-repo", type=str, default=None,
                        help="Refused here: this package does not upload.")
    parser.add_argument("--quant-predicate", type=str, choices=QUANT_RECIPES, default=None,
                        help="Mixed-bit quantization recipe (with --quantize).")
    parser.add_argument("-d", "--dequantize", action="store_true", default=False,
                        help="Dequantize a quantized model.")
    parser.add_argument("--trust-remote-code", action="store_true", default=False,
                        help="Accepted as mlx-lm's; no code from a checkpoint runs here.")
    return parser
