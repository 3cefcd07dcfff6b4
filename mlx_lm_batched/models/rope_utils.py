"""mlx-lm's ``models.rope_utils`` module name: ``initialize_rope`` builds every RoPE
variant this package supports (``layers/rope.py``)."""

from ..layers.rope import initialize_rope

__all__ = ["initialize_rope"]
