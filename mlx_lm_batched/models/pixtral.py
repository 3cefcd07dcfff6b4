"""Pixtral (Mistral): a LLaVA-style checkpoint saved as ``pixtral``, its Mistral /
Llama text model under ``text_config`` and ``language_model.``; the Pixtral vision
encoder and projector are dropped. Image input is not supported: these checkpoints
generate from text only.

transformers' own ``pixtral`` config is the vision encoder alone (no text model):
it is refused with a line saying so."""

from dataclasses import dataclass

from . import mistral3
from .multimodal import accepts_text_config


@accepts_text_config
@dataclass
class ModelArgs(mistral3.ModelArgs):
    @classmethod
    def from_dict(cls, params):
        if not isinstance(params.get("text_config"), dict):
            raise ValueError("pixtral: the config has no text_config (a vision encoder "
                             "alone, as transformers' 'pixtral' config is, cannot generate "
                             "text)")
        return super().from_dict(params)


class Model(mistral3.Model):
    pass
