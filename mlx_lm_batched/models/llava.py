"""mlx-lm's ``models.llava`` module name: the registry serves ``llava`` with
``models/mistral3.py``."""

from .mistral3 import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
