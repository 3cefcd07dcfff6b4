"""Architecture registry: maps a config's ``model_type`` to its module."""

import importlib

from .. import _submodules

# model_type -> module in this package. Aliases share a module when the
# Hugging Face architectures differ only in config values.
MODEL_TYPES = {
    "afm7": "afm7",
    "afmoe": "afmoe",
    "apertus": "apertus",
    "baichuan_m1": "baichuan_m1",
    "bailing_hybrid": "bailing_hybrid",
    "bailing_moe": "bailing_moe",
    "bailing_moe_v3": "bailing_moe_v3",
    "bailing_moe_linear": "bailing_moe_linear",
    "bitnet": "bitnet",
    "cohere": "cohere",
    "cohere2": "cohere2",
    "dbrx": "dbrx",
    "deepseek": "deepseek",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v32": "deepseek_v32",
    "deepseek_v41": "deepseek_v41",
    "deepseek_v41_text": "deepseek_v41",
    "dots1": "dots1",
    "ernie4_5": "ernie4_5",
    "ernie4_5_moe": "ernie4_5_moe",
    "exaone": "exaone",
    "exaone4": "exaone4",
    "exaone_moe": "exaone_moe",
    "falcon_h1": "falcon_h1",
    "falcon_mamba": "mamba",
    "gear": "gear",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3_text",
    "gemma3n": "gemma3n",
    "gemma3n_text": "gemma3n_text",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4_text",
    "gemma4_unified": "gemma4",
    "glm": "glm",
    "glm4": "glm4",
    "glm4_moe": "glm4_moe",
    "glm4_moe_lite": "glm4_moe_lite",
    "glm_moe_dsa": "glm_moe_dsa",
    "gpt2": "gpt2",
    "gpt_bigcode": "gpt_bigcode",
    "gpt_neox": "gpt_neox",
    "gpt_oss": "gpt_oss",
    "gptj": "gptj",
    "granite": "granite",
    "granitemoe": "granitemoe",
    "granitemoehybrid": "granitemoehybrid",
    "helium": "helium",
    "hunyuan": "hunyuan",
    "hunyuan_v1_dense": "hunyuan_v1_dense",
    "hunyuan_v1_moe": "hunyuan_v1_moe",
    "internlm2": "internlm2",
    "internlm3": "internlm3",
    "iquestcoder": "llama",
    "iquestloopcoder": "iquestloopcoder",
    "jamba": "jamba",
    "joyai_llm_flash": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "kimi_k25": "kimi_k25",
    "kimi_k3": "kimi_k3",
    "kimi_linear": "kimi_linear",
    "kimi_vl": "kimi_vl",
    "Klear": "Klear",
    "laguna": "laguna",
    "lfm2": "lfm2",
    "lfm2-vl": "lfm2_vl",
    "lfm2_moe": "lfm2_moe",
    "lille-130m": "lille_130m",
    "llama": "llama",
    "llama4": "llama4",
    "llama4_text": "llama4_text",
    "llava": "mistral3",
    "longcat_flash": "longcat_flash",
    "longcat_flash_ngram": "longcat_flash_ngram",
    "mamba": "mamba",
    "mamba2": "mamba2",
    "mellum": "mellum",
    "mimo": "mimo",
    "mimo_v2_flash": "mimo_v2_flash",
    "minicpm": "minicpm",
    "minicpm3": "minicpm3",
    "minimax": "minimax",
    "minimax_m2": "minimax_m2",
    "minimax_m3_vl": "minimax_m3_vl",
    "ministral3": "ministral3",
    "mistral": "llama",
    "mistral3": "mistral3",
    "mistral4": "mistral4",
    "mixtral": "mixtral",
    "nanbeige": "nanbeige",
    "nanochat": "nanochat",
    "muse_glimmer": "muse_glimmer",
    "muse_spark": "muse_spark",
    "nemotron": "nemotron",
    "nemotron-nas": "nemotron_nas",
    "nemotron_h": "nemotron_h",
    "olmo": "olmo",
    "olmo2": "olmo2",
    "olmo3": "olmo3",
    "olmo_hybrid": "olmo_hybrid",
    "olmoe": "olmoe",
    "openelm": "openelm",
    "phi": "phi",
    "phi-msft": "phixtral",
    "phi3": "phi3",
    "phi3small": "phi3small",
    "phimoe": "phimoe",
    "phixtral": "phixtral",
    "plamo2": "plamo2",
    "prism_hadamard_qwen35": "prism_hadamard_qwen35",
    "pixtral": "pixtral",
    "plamo": "plamo",
    "plamo3": "plamo3",
    "qwen": "qwen",
    "qwen2": "qwen2",
    "qwen2_5_vl": "qwen2_vl",
    "qwen2_moe": "qwen2_moe",
    "qwen2_vl": "qwen2_vl",
    "qwen3": "qwen3",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_moe": "qwen3_moe",
    "qwen3_next": "qwen3_next",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl_moe",
    "recurrent_gemma": "recurrent_gemma",
    "rwkv7": "rwkv7",
    "seed_oss": "seed_oss",
    "smollm3": "smollm3",
    "solar_open": "solar_open",
    "spark2_5": "spark2_5",
    "stablelm": "stablelm",
    "step3p5": "step3p5",
    "starcoder2": "starcoder2",
    "talkie": "talkie",
    "telechat3": "telechat3",
    "xverse": "llama",
    "youtu": "youtu_llm",
    "youtu_llm": "youtu_llm",
}


# (model_type, architecture) -> the model_type whose module serves it: one model_type
# name that two different architectures use (mlx-lm's MODEL_ARCHITECTURE_REMAPPING).
ARCHITECTURE_REMAPPING = {
    ("bailing_hybrid", "BailingMoeV3ForCausalLM"): "bailing_moe_v3",
}


def resolve_model_type(config):
    """The registered model_type serving ``config``: its ``model_type``, unless one of
    its ``architectures`` is remapped (``ARCHITECTURE_REMAPPING``)."""
    model_type = config.get("model_type")
    for arch in config.get("architectures") or ():
        model_type = ARCHITECTURE_REMAPPING.get((config.get("model_type"), arch), model_type)
    return model_type


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


def __getattr__(name):
    # ``mlx_lm_batched.models.cache`` ... as attributes, as after ``import mlx_lm``.
    return _submodules.submodule(__name__, name)
