"""mlx-lm's ``mlx_lm.gguf`` module name: reading GGUF files (``loading/gguf.py``)."""

from .loading.gguf import gguf_architecture, read_gguf

__all__ = ["gguf_architecture", "read_gguf"]
