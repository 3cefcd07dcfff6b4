"""Gemma 3n (multimodal checkpoints): the Gemma 3n text model under ``text_config``
and ``language_model.``; the vision and audio towers and their embedders are ignored."""

from dataclasses import dataclass

from . import gemma3n_text
from .multimodal import (
    TextConfigArgs,
    accepts_text_config,
    check_text_model_type,
    language_model_weights,
)


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, gemma3n_text.ModelArgs):
    pass


class Model(gemma3n_text.Model):
    def __init__(self, args: ModelArgs):
        check_text_model_type(args, ("gemma3n_text",))
        super().__init__(args)

    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
