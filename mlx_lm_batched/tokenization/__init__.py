"""tokenization."""

# mlx-lm registers its NewlineTokenizer with AutoTokenizer when its tokenizer module
# loads; this package's loader must find a checkpoint's "NewlineTokenizer" the same way.
from . import newline  # noqa: F401
