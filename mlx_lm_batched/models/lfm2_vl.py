"""LFM2-VL (Liquid AI): the LFM2 text model under ``text_config`` and
``language_model.``; the SigLIP 2 vision tower and its projector are dropped. Image
input is not supported: these checkpoints generate from text only."""

from dataclasses import dataclass
from typing import Optional

from . import lfm2
from .multimodal import TextConfigArgs, accepts_text_config, check_text_model_type, language_model_weights


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, lfm2.ModelArgs):
    text_model_type: Optional[str] = None

    def __post_init__(self):
        super().__post_init__()
        check_text_model_type(self, ("lfm2",))


class Model(lfm2.Model):
    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
