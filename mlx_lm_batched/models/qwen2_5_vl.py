"""mlx-lm's ``models.qwen2_5_vl`` module name: the registry serves ``qwen2_5_vl`` with
``models/qwen2_vl.py``."""

from .qwen2_vl import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
