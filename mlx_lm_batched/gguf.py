"""mlx-lm's ``mlx_lm.gguf`` module name: reading GGUF files (``loading/gguf.py``) and
writing a llama checkpoint as one (``loading/gguf_write.py``)."""

from .loading.gguf import gguf_architecture, read_gguf
from .loading.gguf_write import convert_to_gguf

__all__ = ["convert_to_gguf", "gguf_architecture", "read_gguf"]
