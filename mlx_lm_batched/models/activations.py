"""mlx-lm's ``models.activations`` module name: its activation functions and modules
(``layers/activations_api.py``, ``layers/mlp.py``)."""

from ..layers.activations_api import (
    SwigluOAI,
    XieLU,
    precise_swiglu,
    swiglu_oai,
    xielu,
)
from ..layers.mlp import swiglu

__all__ = ["SwigluOAI", "XieLU", "precise_swiglu", "swiglu", "swiglu_oai", "xielu"]
