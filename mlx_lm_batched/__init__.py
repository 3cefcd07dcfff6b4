"""mlx_lm_batched: mlx-lm with batched generation as a first-class citizen.

Import it instead of ``mlx_lm``: ``from mlx_lm_batched import load, generate,
stream_generate, batch_generate``.
"""

from . import _blas  # noqa: F401  (must run before the first `import mlx.core`)

__version__ = "0.1.0"

_EXPORTS = {
    "load": "utils",
    "generate": "generate",
    "stream_generate": "generate",
    "batch_generate": "generate",
    "stream_batch_generate": "generate",
    "generate_step": "generate",
    "GenerationResponse": "generate",
    "BatchResponse": "generate",
    "convert": "convert",
}


def __getattr__(name):
    # Lazy, so `import mlx_lm_batched` stays cheap and the BLAS preload runs first.
    if name in _EXPORTS:
        import importlib

        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'mlx_lm_batched' has no attribute '{name}'")


__all__ = list(_EXPORTS)
