"""``python -m mlx_lm_batched.convert``: convert a Hugging Face model or a GGUF file to
an MLX directory (flags as mlx-lm's ``convert``)."""

import argparse

from ..loading.convert import DTYPES, convert


def main(argv=None):
    """Run the converter; returns the exit code (1 with one error line on bad input)."""
    parser = argparse.ArgumentParser(description="Convert a Hugging Face model or GGUF to MLX.")
    parser.add_argument("--hf-path", "--model", required=True, help="HF directory, repo id or .gguf file")
    parser.add_argument("--mlx-path", default="mlx_model", help="output directory")
    parser.add_argument("-q", "--quantize", action="store_true")
    parser.add_argument("--q-group-size", type=int, default=None)
    parser.add_argument("--q-bits", type=int, default=None)
    parser.add_argument("--dtype", choices=list(DTYPES), default=None)
    parser.add_argument("-d", "--dequantize", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = convert(args.hf_path, args.mlx_path, args.quantize, args.q_group_size, args.q_bits,
                      dtype=args.dtype, dequantize=args.dequantize)
    except (ValueError, OSError, NotImplementedError) as e:
        parser.exit(1, f"error: {e}\n")
    print(f"[convert] wrote {out}")
    return 0

