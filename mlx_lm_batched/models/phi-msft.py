"""The ``models.phi-msft`` module name, so every registered model_type has a module of its
name: the registry serves ``phi-msft`` with ``models/phixtral.py`` (mlx-lm has no module of
this name; it remaps the type or does not know it)."""

from .phixtral import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
