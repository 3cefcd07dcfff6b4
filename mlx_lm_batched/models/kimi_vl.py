"""Kimi-VL (Moonshot): the DeepSeek V3 text model (MLA + sigmoid-routed MoE) under
``text_config`` and ``language_model.``; the MoonViT vision tower and projector are
dropped. Image input is not supported: these checkpoints generate from text only."""

from dataclasses import dataclass
from typing import Optional

from . import deepseek_v3
from .multimodal import TextConfigArgs, accepts_text_config, check_text_model_type, language_model_weights

# Kimi's own name for its DeepSeek-V3 text model counts as the same.
TEXT_MODEL_TYPES = ("deepseek_v3", "kimi_k2")


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, deepseek_v3.ModelArgs):
    text_model_type: Optional[str] = None

    def __post_init__(self):
        check_text_model_type(self, TEXT_MODEL_TYPES)


class Model(deepseek_v3.Model):
    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
