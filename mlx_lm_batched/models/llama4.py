"""Llama 4 (Scout, Maverick): the language model of the multimodal checkpoint, a
Llama 4 text model under ``text_config`` with ``language_model.`` weight prefixes;
the vision model and its projector are ignored."""

from dataclasses import dataclass

from . import llama4_text
from .multimodal import (
    TextConfigArgs,
    accepts_text_config,
    check_text_model_type,
    language_model_weights,
)


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, llama4_text.ModelArgs):
    pass


class Model(llama4_text.Model):
    def __init__(self, args: ModelArgs):
        check_text_model_type(args, ("llama4_text",))
        super().__init__(args)

    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
