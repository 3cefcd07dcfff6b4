"""mlx-lm's ``models.mistral`` module name: the registry serves ``mistral`` with
``models/llama.py``."""

from .llama import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
