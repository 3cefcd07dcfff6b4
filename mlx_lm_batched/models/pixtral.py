"""Pixtral (Mistral): a LLaVA-style checkpoint saved as ``pixtral``, its Mistral /
Llama text model under ``text_config`` and ``language_model.``; the Pixtral vision
encoder and projector are dropped. Image input is not supported: these checkpoints
generate from text only."""

from .mistral3 import Model, ModelArgs  # noqa: F401  (the same text-model handling)

__all__ = ["Model", "ModelArgs"]
