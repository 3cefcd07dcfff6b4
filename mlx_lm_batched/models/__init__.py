"""Architecture registry: maps a config's ``model_type`` to its module."""

import importlib

# model_type -> module in this package. Aliases share a module when the
# Hugging Face architectures differ only in config values.
MODEL_TYPES = {
    "gpt_oss": "gpt_oss",
    "glm4_moe": "glm4_moe",
    "dots1": "dots1",
    "ernie4_5_moe": "ernie4_5_moe",
    "granitemoe": "granitemoe",
    "phimoe": "phimoe",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "llama": "llama",
    "mistral": "llama",
    "gemma3_text": "gemma3_text",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "starcoder2": "starcoder2",
    "granite": "granite",
    "helium": "helium",
    "olmo2": "olmo2",
    "olmo3": "olmo3",
    "smollm3": "smollm3",
    "seed_oss": "seed_oss",
    "ernie4_5": "ernie4_5",
    "exaone4": "exaone4",
    "glm4": "glm4",
    "apertus": "apertus",
    "hunyuan_v1_dense": "hunyuan_v1_dense",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
    "phi": "phi",
    "phi3": "phi3",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "gpt_bigcode": "gpt_bigcode",
    "stablelm": "stablelm",
    "cohere": "cohere",
    "cohere2": "cohere2",
    "glm": "glm",
    "nemotron": "nemotron",
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
