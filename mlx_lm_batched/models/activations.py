"""mlx-lm's ``models.activations`` module name: ``swiglu`` and Apertus's ``XieLU``."""

from ..layers.mlp import swiglu
from .apertus import XIELU as XieLU

__all__ = ["XieLU", "swiglu"]
