"""mlx-lm's ``mlx_lm.gguf`` module name: reading GGUF files (``loading/gguf.py``) and
writing a llama checkpoint as one (``loading/gguf_write.py``)."""

from .loading.gguf import gguf_architecture, read_gguf
from .loading.gguf_names import (
    GGMLFileType,
    TokenType,
    permute_weights,
    translate_weight_names,
)
from .loading.gguf_vocab import HfVocab, prepare_metadata
from .loading.gguf_write import convert_to_gguf

__all__ = ["GGMLFileType", "HfVocab", "TokenType", "convert_to_gguf", "gguf_architecture",
           "permute_weights", "prepare_metadata", "read_gguf", "translate_weight_names"]
