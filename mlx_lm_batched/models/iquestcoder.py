"""mlx-lm's ``models.iquestcoder`` module name: the registry serves ``iquestcoder`` with
``models/llama.py``."""

from .llama import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
