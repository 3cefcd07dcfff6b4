"""The package version: pyproject.toml reads it from here (one place to change)."""

__version__ = "0.8.10"
