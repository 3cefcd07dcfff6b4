"""The ``models.deepseek_v41_text`` module name, so every registered model_type has a module of its
name: the registry serves ``deepseek_v41_text`` with ``models/deepseek_v41.py`` (mlx-lm has no module of
this name; it remaps the type or does not know it)."""

from .deepseek_v41 import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
