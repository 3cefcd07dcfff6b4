"""The ``models.xverse`` module name, so every registered model_type has a module of its
name: the registry serves ``xverse`` with ``models/llama.py`` (mlx-lm has no module of
this name; it remaps the type or does not know it)."""

from .llama import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
