"""Qwen 2 VL and Qwen 2.5 VL: the Qwen 2 text model (``text_config``, or the flat
config of older checkpoints) without the ``visual`` tower; M-RoPE reduces to plain
RoPE on text."""

from dataclasses import dataclass

from . import qwen2
from .multimodal import (
    TextConfigArgs,
    accepts_text_config,
    language_model_weights,
    text_rope_scaling,
)


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, qwen2.ModelArgs):
    def __post_init__(self):
        super().__post_init__()
        self.rope_scaling = text_rope_scaling(self.rope_scaling)


class Model(qwen2.Model):
    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
