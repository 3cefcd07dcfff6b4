"""Mistral 3 and LLaVA checkpoints: their Mistral / Llama / Ministral 3 text model
under ``text_config`` and ``language_model.``; the vision tower and projector are
ignored."""

from dataclasses import dataclass
from typing import Optional

from . import ministral3
from .multimodal import (
    TextConfigArgs,
    accepts_text_config,
    check_text_model_type,
    language_model_weights,
)

TEXT_MODEL_TYPES = ("mistral", "llama", "ministral3", "ministral")


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, ministral3.ModelArgs):
    text_model_type: Optional[str] = None

    def __post_init__(self):
        super().__post_init__()
        check_text_model_type(self, TEXT_MODEL_TYPES)


class Model(ministral3.Model):
    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
