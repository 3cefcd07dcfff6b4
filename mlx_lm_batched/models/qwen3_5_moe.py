"""mlx-lm's ``models.qwen3_5_moe`` module name: the registry serves ``qwen3_5_moe`` with
``models/qwen3_5.py``."""

from .qwen3_5 import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
