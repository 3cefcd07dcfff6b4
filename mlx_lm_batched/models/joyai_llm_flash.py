"""mlx-lm's ``models.joyai_llm_flash`` module name: the registry serves ``joyai_llm_flash`` with
``models/deepseek_v3.py``."""

from .deepseek_v3 import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
