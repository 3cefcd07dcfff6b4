"""mlx-lm's ``models.switch_layers`` module name: the expert layers (``layers/moe.py``).
``SwitchGLU``/``SwitchMLP`` take the activation by name or as a picklable callable of
the gate (``act(gate) * up``), not mlx-lm's two-argument ``SwiGLU`` module, which is
here for code that calls it directly."""

from ..layers.activations_api import SwiGLU
from ..layers.mlp import swiglu
from ..layers.moe import QuantizedSwitchLinear, SwitchGLU, SwitchLinear, SwitchMLP

__all__ = ["QuantizedSwitchLinear", "SwiGLU", "SwitchGLU", "SwitchLinear", "SwitchMLP", "swiglu"]
