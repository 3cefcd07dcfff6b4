"""mlx-lm's ``models.nemotron-nas`` module name: the registry serves ``nemotron-nas`` with
``models/nemotron_nas.py``.
mlx-lm names this file with the hyphen too; Python's import statement cannot spell it, so
mlx-lm code reaches it with ``importlib.import_module``."""

from .nemotron_nas import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
