"""The ``models.youtu`` module name, so every registered model_type has a module of its
name: the registry serves ``youtu`` with ``models/youtu_llm.py`` (mlx-lm has no module of
this name; it remaps the type or does not know it)."""

from .youtu_llm import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
