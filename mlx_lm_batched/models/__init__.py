"""Architecture registry: maps a config's ``model_type`` to its module."""

import importlib

# model_type -> module in this package. Aliases share a module when the
# Hugging Face architectures differ only in config values.
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "gemma3_text": "gemma3_text",
}


def supported_model_types():
    """Sorted list of every ``model_type`` that loads."""
    return sorted(MODEL_TYPES)


def get_model_module(model_type):
    """Import the architecture module for ``model_type``.

    Raises ``ValueError`` naming the unknown type and listing the supported ones.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"unknown model_type '{model_type}'; supported: {', '.join(supported_model_types())}"
        )
    return importlib.import_module(f"{__name__}.{MODEL_TYPES[model_type]}")
