"""Kimi K2.5 (Moonshot): Kimi-VL's layout (a DeepSeek V3 / Kimi K2 text model under
``text_config`` and ``language_model.``) at Kimi K2's scale; the vision tower and
projector are dropped. Image input is not supported: these checkpoints generate from
text only."""

from .kimi_vl import Model, ModelArgs  # noqa: F401  (the same text-model handling)

__all__ = ["Model", "ModelArgs"]
