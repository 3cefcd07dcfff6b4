"""mlx-lm's ``models.rope_utils`` module name: ``initialize_rope`` builds every RoPE
variant this package supports (``layers/rope.py``, modules called with per-row
offsets); mlx-lm's RoPE classes and ``apply_yarn_mscale`` with its constructors and
results (``layers/rope_classes.py``)."""

from ..layers.rope import initialize_rope
from ..layers.rope_classes import (
    DynamicNTKScalingRoPE,
    Llama3RoPE,
    ProportionalRoPE,
    SuScaledRoPE,
    YarnRoPE,
    apply_yarn_mscale,
)

__all__ = ["DynamicNTKScalingRoPE", "Llama3RoPE", "ProportionalRoPE", "SuScaledRoPE",
           "YarnRoPE", "apply_yarn_mscale", "initialize_rope"]
