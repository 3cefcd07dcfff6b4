"""The ``models.gemma4_unified`` module name, so every registered model_type has a module of its
name: the registry serves ``gemma4_unified`` with ``models/gemma4.py`` (mlx-lm has no module of
this name; it remaps the type or does not know it)."""

from .gemma4 import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
