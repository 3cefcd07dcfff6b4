"""mlx-lm's ``models.kimi_k2`` module name: the registry serves ``kimi_k2`` with
``models/deepseek_v3.py``."""

from .deepseek_v3 import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
