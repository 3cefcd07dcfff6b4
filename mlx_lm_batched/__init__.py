"""mlx_lm_batched: mlx-lm with batched generation as a first-class citizen.

Import it instead of ``mlx_lm``: ``from mlx_lm_batched import load, generate,
stream_generate, batch_generate``.
"""

import warnings

from . import _blas  # noqa: F401  (must run before the first `import mlx.core`)

# `python -m mlx_lm_batched.generate` runs a module this package also imports
# (as mlx-lm's does); runpy's warning about that is noise for users.
warnings.filterwarnings(
    "ignore", category=RuntimeWarning, message=r".*'mlx_lm_batched\.\w+' found in sys\.modules"
)

from .convert import convert  # noqa: E402
from .generate import (  # noqa: E402
    BatchResponse,
    GenerationResponse,
    batch_generate,
    generate,
    generate_step,
    stream_batch_generate,
    stream_generate,
)
from .utils import load  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "load",
    "generate",
    "stream_generate",
    "batch_generate",
    "stream_batch_generate",
    "generate_step",
    "GenerationResponse",
    "BatchResponse",
    "convert",
]
