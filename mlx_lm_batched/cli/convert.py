"""``python -m mlx_lm_batched.convert``: convert a Hugging Face model or a GGUF file to
an MLX directory (flags as mlx-lm's ``convert``)."""

from ..loading.convert import convert
from .convert_args import configure_parser


def main(argv=None):
    """Run the converter; returns the exit code (1 with one error line on bad input)."""
    parser = configure_parser()
    args = parser.parse_args(argv)
    if not args.hf_path:
        parser.exit(2, "error: --hf-path (or --model) is required: a Hugging Face directory, "
                       "repo id or .gguf file\n")
    try:
        out = convert(**vars(args))
    except (ValueError, OSError, NotImplementedError) as e:
        parser.exit(1, f"error: {e}\n")
    print(f"[convert] wrote {out}")
    return 0
