"""Gemma 3 (multimodal checkpoints): the Gemma 3 text model under ``text_config`` and
``language_model.``; the SigLIP tower and projector are ignored."""

from dataclasses import dataclass

from . import gemma3_text
from .multimodal import TextConfigArgs, accepts_text_config, language_model_weights


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, gemma3_text.ModelArgs):
    pass


class Model(gemma3_text.Model):
    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
