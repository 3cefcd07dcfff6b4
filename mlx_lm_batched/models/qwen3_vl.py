"""Qwen 3 VL: the Qwen 3 text model under ``text_config`` and
``model.language_model.``, without the ``visual`` tower; interleaved M-RoPE reduces
to plain RoPE on text."""

from dataclasses import dataclass

from . import qwen3
from .multimodal import (
    TextConfigArgs,
    accepts_text_config,
    language_model_weights,
    text_rope_scaling,
)


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, qwen3.ModelArgs):
    def __post_init__(self):
        super().__post_init__()
        self.rope_scaling = text_rope_scaling(self.rope_scaling)


class Model(qwen3.Model):
    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
