"""Gemma 4 (multimodal checkpoints): the Gemma 4 text model under ``text_config`` and
``language_model.``; the vision and audio towers and their embedders are ignored.
Also serves ``gemma4_unified`` (the encoder-free variant: its vision embedder is
ignored likewise), whose text model is Gemma 4's under another name.

As transformers does, the image/video/audio placeholder tokens are embedded as
``pad_token_id`` (what they are when no media fills them), per-layer inputs included."""

from dataclasses import dataclass
from typing import Optional

from . import gemma4_text
from .multimodal import (
    TextConfigArgs,
    accepts_text_config,
    check_text_model_type,
    language_model_weights,
)


# transformers' defaults for the unified variant's text model where they differ from
# Gemma 4's: no per-layer inputs, a longer window and context.
UNIFIED_TEXT_DEFAULTS = dict(hidden_size_per_layer_input=0, sliding_window=1024,
                             max_position_embeddings=262144)


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, gemma4_text.ModelArgs):
    image_token_id: Optional[int] = 258880
    video_token_id: Optional[int] = 258884
    audio_token_id: Optional[int] = 258881
    text_model_type: Optional[str] = None

    @classmethod
    def from_dict(cls, params):
        if params.get("model_type") == "gemma4_unified":
            text = params.get("text_config")
            if isinstance(text, dict):
                params = dict(params, text_config=dict(UNIFIED_TEXT_DEFAULTS, **text))
            else:
                params = dict(UNIFIED_TEXT_DEFAULTS, **params)
        return super().from_dict(params)

    def __post_init__(self):
        super().__post_init__()
        check_text_model_type(self, ("gemma4_text", "gemma4_unified_text"))


class Model(gemma4_text.Model):
    def placeholder_ids(self, args):
        return tuple(t for t in (args.image_token_id, args.video_token_id, args.audio_token_id)
                     if t is not None)

    def sanitize(self, weights):
        return super().sanitize(language_model_weights(weights))
