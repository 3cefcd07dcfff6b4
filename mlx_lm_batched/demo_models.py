"""Paths of the models shipped as PyPI wheels (the CLI's and the server's default);
``loading/demo_models.py``."""

from .loading.demo_models import gemma3_gguf_path, smollm2_gguf_path

__all__ = ["gemma3_gguf_path", "smollm2_gguf_path"]
