"""mlx-lm's ``models.falcon_mamba`` module name: the registry serves ``falcon_mamba`` with
``models/mamba.py``."""

from .mamba import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
