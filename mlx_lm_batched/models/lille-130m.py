"""mlx-lm's ``models.lille-130m`` module name: the registry serves ``lille-130m`` with
``models/lille_130m.py``.
mlx-lm names this file with the hyphen too; Python's import statement cannot spell it, so
mlx-lm code reaches it with ``importlib.import_module``."""

from .lille_130m import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
