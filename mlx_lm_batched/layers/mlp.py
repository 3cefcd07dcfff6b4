"""Feed-forward layers and the activations they take by Hugging Face name."""

import mlx.core as mx
import mlx.nn as nn

from . import cpu_ops


def relu2(x):
    """``relu(x) ** 2`` (Nemotron, Primer)."""
    return mx.square(nn.relu(x))


def sigmoid(x):
    """``sigmoid(x)`` (a Python function: MLX's own cannot be pickled)."""
    return mx.sigmoid(x)


ACTIVATIONS = {
    "silu": cpu_ops.silu,
    "swish": cpu_ops.silu,
    "gelu": nn.gelu,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_new": nn.gelu_approx,
    "gelu_fast": nn.gelu_fast_approx,
    "relu": nn.relu,
    "relu2": relu2,
    "sigmoid": sigmoid,
}


def swiglu(gate, x):
    """``silu(gate) * x`` (mlx-lm's ``activations.swiglu``)."""
    return cpu_ops.swiglu(gate, x)


class Activation:
    """An activation held by its Hugging Face name.

    Modules store this instead of the function: MLX's activations are compiled
    functions, which ``copy.deepcopy`` and ``pickle`` cannot copy, while a name can."""

    def __init__(self, name):
        if name not in ACTIVATIONS:
            raise ValueError(f"unsupported activation '{name}' (known: {', '.join(ACTIVATIONS)})")
        self.name = name

    def __call__(self, x):
        return ACTIVATIONS[self.name](x)

    def __repr__(self):
        return f"Activation({self.name!r})"


def activation(act):
    """``act`` as a callable a module can store: a name becomes an ``Activation``;
    a callable passes through (it must pickle for the model to copy)."""
    if isinstance(act, str):
        return Activation(act)
    if not callable(act):
        raise TypeError(f"activation must be a name or a callable, got {type(act).__name__}")
    return act


class MLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, hidden_size, intermediate_size, act="silu", bias=False, fused_gate_up=False):
        """``fused_gate_up``: one ``gate_up_proj`` holding gate then up (GLM 4, Phi 3)."""
        super().__init__()
        if fused_gate_up:
            self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        else:
            self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
            self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = activation(act)
        self.fused_gate_up = fused_gate_up

    def __call__(self, x):
        if self.fused_gate_up:
            gate, up = mx.split(cpu_ops.linear(self.gate_up_proj, x), 2, axis=-1)
        else:
            gate, up = cpu_ops.linears((self.gate_proj, self.up_proj), x)
        if isinstance(self.act, Activation) and self.act.name in ("silu", "swish"):
            hidden = cpu_ops.swiglu(gate, up)  # one node on the CPU
        else:
            hidden = self.act(gate) * up
        return cpu_ops.linear(self.down_proj, hidden)


class DenseMLP(nn.Module):
    """Ungated MLP ``down(act(up(x)))``; ``names``: the checkpoint's (up, down) names."""

    def __init__(self, hidden_size, intermediate_size, act="gelu", bias=True,
                 names=("up_proj", "down_proj")):
        super().__init__()
        self.names = tuple(names)
        setattr(self, names[0], nn.Linear(hidden_size, intermediate_size, bias=bias))
        setattr(self, names[1], nn.Linear(intermediate_size, hidden_size, bias=bias))
        self.act = activation(act)

    def __call__(self, x):
        up, down = (getattr(self, n) for n in self.names)
        return cpu_ops.linear(down, self.act(cpu_ops.linear(up, x)))
