"""mlx-lm's ``models.switch_layers`` module name: the expert layers (``layers/moe.py``).
``SwitchGLU`` takes the activation by name, as a picklable callable of the gate
(``act(gate) * up``) or as mlx-lm's two-argument module (``SwiGLU()``, called as
``activation(up, gate)``); ``SwitchMLP`` by name or as a callable."""

from ..layers.activations_api import SwiGLU
from ..layers.mlp import swiglu
from ..layers.moe import QuantizedSwitchLinear, SwitchGLU, SwitchLinear, SwitchMLP

__all__ = ["QuantizedSwitchLinear", "SwiGLU", "SwitchGLU", "SwitchLinear", "SwitchMLP", "swiglu"]
