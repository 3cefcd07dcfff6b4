"""mlx-lm's ``models.lfm2-vl`` module name: the registry serves ``lfm2-vl`` with
``models/lfm2_vl.py``.
mlx-lm names this file with the hyphen too; Python's import statement cannot spell it, so
mlx-lm code reaches it with ``importlib.import_module``."""

from .lfm2_vl import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
