"""Mixture-of-experts building blocks: every expert's weights in one stacked array.

A switch layer holds ``(num_experts, out, in)`` weights and evaluates the experts
picked for every token with one ``mx.gather_mm`` (``mx.gather_qmm`` when quantized):
all rows and tokens of a batch at once, never a Python loop over rows or experts.
Each token's result depends only on that token, so padded batches stay exact.

Public API (kept stable; other families import it):

- ``SwitchLinear(input_dims, output_dims, num_experts, bias=False)`` and its
  quantized form ``QuantizedSwitchLinear`` (``to_quantized(group_size, bits, mode)``,
  so ``nn.quantize`` and the loader's ``quantize_like`` handle it);
  called as ``layer(x, indices, sorted_indices=False)``.
- ``SwitchGLU(input_dims, hidden_dims, num_experts, activation="silu", bias=False,
  glu=None)`` and ``SwitchMLP(input_dims, hidden_dims, num_experts,
  activation="gelu", bias=False)`` (an activation name or a picklable callable): ``switch(x, indices)`` with ``x (..., D)``
  and ``indices (..., k)`` returns ``(..., k, D)``.
- ``stack_experts(weights, prefix, num_experts, names=..., src=...)``: turn HF
  per-expert tensors into the stacked switch-layer names (for ``sanitize``).
- ``topk_indices(scores, k)``: the k largest scores' indices (unordered);
  ``softmax_topk(logits, k, normalize, choice_bias, norm_min)``: the usual router;
  ``combine_experts(y, weights, dtype)``: the weighted sum over the k experts.
- ``SparseMoE``: gate + switch_mlp (+ an optional ``SharedExpert``), softmax-routed.
- ``InputScaledMoE``: router + experts + shared_expert, the sigmoid score of each
  chosen expert scaling its input (Llama 4).
"""

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .mlp import activation as activation_fn

try:
    from mlx.nn.layers.quantized import _defaults_for_mode
except ImportError:  # private in mlx; the documented defaults per mode

    def _defaults_for_mode(mode, group_size, bits):
        defaults = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}
        g, b = defaults.get(mode, (64, 4))
        return group_size or g, bits or b

# Above this many (token, expert) pairs, tokens are sorted by expert first so the
# gathered matmuls run over contiguous expert segments (fast prefill).
SORT_THRESHOLD = 64


class SwitchLinear(nn.Module):
    """``num_experts`` linear layers; ``x @ weight[e].T (+ bias[e])`` for each chosen e."""

    def __init__(self, input_dims, output_dims, num_experts, bias=False):
        super().__init__()
        scale = input_dims**-0.5
        self.weight = mx.random.uniform(-scale, scale, (num_experts, output_dims, input_dims))
        if bias:
            self.bias = mx.zeros((num_experts, output_dims))

    @property
    def input_dims(self):
        return self.weight.shape[2]

    @property
    def output_dims(self):
        return self.weight.shape[1]

    @property
    def num_experts(self):
        return self.weight.shape[0]

    def __call__(self, x, indices, sorted_indices=False):
        """``x (..., 1 or k, 1, in)`` and ``indices (..., k)`` -> ``(..., k, 1, out)``."""
        w = self.weight
        if w.dtype != mx.float32 and mx.default_device() == mx.cpu:
            # MLX's CPU gather_mm is float32-only: half-precision experts are upcast per
            # call (a copy of every expert; the CLI loads float32 on the CPU anyway).
            out = mx.gather_mm(x.astype(mx.float32), w.swapaxes(-1, -2).astype(mx.float32),
                               rhs_indices=indices, sorted_indices=sorted_indices).astype(w.dtype)
        else:
            out = mx.gather_mm(x, w.swapaxes(-1, -2), rhs_indices=indices,
                               sorted_indices=sorted_indices)
        if "bias" in self:
            out = out + mx.expand_dims(self.bias[indices], -2)
        return out

    def to_quantized(self, group_size=None, bits=None, mode="affine"):
        return QuantizedSwitchLinear.from_switch_linear(self, group_size, bits, mode)


class QuantizedSwitchLinear(nn.Module):
    """Quantized ``SwitchLinear``: same call, weights packed per expert."""

    def __init__(self, input_dims, output_dims, num_experts, bias=False, group_size=None,
                 bits=None, mode="affine", weight=None):
        super().__init__()
        self.group_size, self.bits = _defaults_for_mode(mode, group_size, bits)
        self.mode = mode
        if weight is None:  # placeholder, normally overwritten by load_weights
            weight = mx.zeros((num_experts, output_dims, input_dims))
        self._set_quantized(weight)
        if bias:
            self.bias = mx.zeros((num_experts, output_dims))
        self.freeze()

    def _set_quantized(self, w):
        self.weight, self.scales, *biases = mx.quantize(w, self.group_size, self.bits,
                                                        mode=self.mode)
        self.biases = biases[0] if biases else None

    @classmethod
    def from_switch_linear(cls, layer, group_size=None, bits=None, mode="affine"):
        E, out_dims, in_dims = layer.weight.shape
        ql = cls(in_dims, out_dims, E, False, group_size, bits, mode, weight=layer.weight)
        if "bias" in layer:
            ql.bias = layer.bias
        ql.freeze()
        return ql

    def dequantized(self):
        """The float ``SwitchLinear`` these weights encode (for ``convert --dequantize``)."""
        w = mx.dequantize(self.weight, self.scales, self.biases, self.group_size, self.bits,
                          mode=self.mode)
        layer = SwitchLinear(w.shape[2], w.shape[1], w.shape[0], bias="bias" in self)
        layer.weight = w
        if "bias" in self:
            layer.bias = self.bias
        return layer

    def __call__(self, x, indices, sorted_indices=False):
        out = mx.gather_qmm(
            x, self.weight, self.scales, self.biases, rhs_indices=indices, transpose=True,
            group_size=self.group_size, bits=self.bits, mode=self.mode,
            sorted_indices=sorted_indices,
        )
        if "bias" in self:
            out = out + mx.expand_dims(self.bias[indices], -2)
        return out


def _sort_by_expert(x, indices):
    """Flatten (token, expert) pairs and order them by expert.

    Returns ``x (N*k, 1, D)`` (one copy per pair), sorted expert ids ``(N*k,)`` and the
    permutation that restores the original pair order.
    """
    k = indices.shape[-1]
    flat = indices.flatten()
    order = mx.argsort(flat)
    restore = mx.argsort(order)
    x = x.reshape(-1, 1, x.shape[-1])[order // k]
    return x, flat[order], restore


def _unsort(y, restore, shape):
    """Inverse of ``_sort_by_expert`` on ``y (N*k, 1, D)``: back to ``(..., k, D)``."""
    return y[restore].reshape(*shape, y.shape[-1])


class _SwitchBase(nn.Module):
    def _route(self, x, indices, project):
        """Run ``project(x, idx, sorted)`` over all (token, expert) pairs; ``(..., k, D)``."""
        if indices.size >= SORT_THRESHOLD:
            xs, idx, restore = _sort_by_expert(x, indices)
            return _unsort(project(xs, idx, True).squeeze(-2), restore, indices.shape)
        xs = mx.expand_dims(x, (-2, -3))  # (..., 1, 1, D) broadcast over the k experts
        return project(xs, indices, False).squeeze(-2)


class SwitchGLU(_SwitchBase):
    """Gated expert MLPs: ``down(glu(gate(x), up(x)))``, default ``act(gate) * up``.

    ``glu(gate, up)`` replaces the default combination (e.g. gpt-oss's clamped SwiGLU).
    ``activation`` may also be mlx-lm's kind: a module called as ``activation(up, gate)``
    (its default ``SwiGLU()``, ``SwigluOAI(...)``, or code's own), kept as a child module.
    """

    def __init__(self, input_dims, hidden_dims, num_experts, activation="silu", bias=False,
                 glu=None):
        super().__init__()
        self.gate_proj = SwitchLinear(input_dims, hidden_dims, num_experts, bias=bias)
        self.up_proj = SwitchLinear(input_dims, hidden_dims, num_experts, bias=bias)
        self.down_proj = SwitchLinear(hidden_dims, input_dims, num_experts, bias=bias)
        if isinstance(activation, nn.Module):  # mlx-lm's two-argument activation module
            self.pair_activation, self.activation = activation, None
        else:
            self.pair_activation, self.activation = None, activation_fn(activation)
        self.glu = glu

    def __call__(self, x, indices):
        def project(xs, idx, srt):
            g = self.gate_proj(xs, idx, srt)
            u = self.up_proj(xs, idx, srt)
            if self.pair_activation is not None:
                h = self.pair_activation(u, g)
            else:
                h = self.glu(g, u) if self.glu is not None else self.activation(g) * u
            return self.down_proj(h, idx, srt)

        return self._route(x, indices, project)


class SwitchMLP(_SwitchBase):
    """Non-gated expert MLPs: ``fc2(act(fc1(x)))``."""

    def __init__(self, input_dims, hidden_dims, num_experts, activation="gelu", bias=False):
        super().__init__()
        self.fc1 = SwitchLinear(input_dims, hidden_dims, num_experts, bias=bias)
        self.fc2 = SwitchLinear(hidden_dims, input_dims, num_experts, bias=bias)
        self.activation = activation_fn(activation)

    def __call__(self, x, indices):
        def project(xs, idx, srt):
            return self.fc2(self.activation(self.fc1(xs, idx, srt)), idx, srt)

        return self._route(x, indices, project)


GLU_NAMES = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


def stack_experts(weights, prefix, num_experts, names=GLU_NAMES, src="experts", dst="switch_mlp"):
    """Stack ``{prefix}.{src}.{e}.{hf}.{param}`` into ``{prefix}.{dst}.{ours}.{param}``.

    ``names`` maps each HF projection name to the switch layer's (e.g. Mixtral's
    ``{"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}``). Handles weights,
    biases and already-quantized ``scales``/``biases``; a no-op when the checkpoint is
    already stacked. Also takes transformers 5's in-memory layout
    (``{src}.gate_up_proj`` ``(E, 2I, H)``, gate first, and ``{src}.down_proj``).
    Returns ``weights`` (modified in place).
    """
    for hf, ours in names.items():
        for param in ("weight", "bias", "scales", "biases"):
            first = f"{prefix}.{src}.0.{hf}.{param}"
            if first not in weights:
                continue
            keys = [f"{prefix}.{src}.{e}.{hf}.{param}" for e in range(num_experts)]
            weights[f"{prefix}.{dst}.{ours}.{param}"] = mx.stack([weights.pop(k) for k in keys])
    fused = weights.pop(f"{prefix}.{src}.gate_up_proj", None)
    if fused is not None:
        gate, up = mx.split(fused, 2, axis=1)
        weights[f"{prefix}.{dst}.gate_proj.weight"] = gate
        weights[f"{prefix}.{dst}.up_proj.weight"] = up
        weights[f"{prefix}.{dst}.down_proj.weight"] = weights.pop(f"{prefix}.{src}.down_proj")
    return weights


def topk_indices(scores, k):
    """Indices of the ``k`` largest entries along the last axis (order unspecified)."""
    return mx.stop_gradient(mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k])


def softmax_topk(logits, k, normalize=False, choice_bias=None, norm_min=0.0, sigmoid=False):
    """Softmax router: top-k experts by probability, their probabilities as weights.
    ``sigmoid``: independent sigmoid scores instead of the softmax (MiniMax-M2).

    ``normalize`` rescales the k weights to sum to 1 (Mixtral; equal to a softmax
    over the top-k logits, as GPT-OSS and Granite compute it); ``norm_min`` bounds
    that sum's divisor from below (Ernie). ``choice_bias`` shifts only the choice,
    not the weights (Ernie's ``e_score_correction_bias``). Computed in float32.
    Returns ``(indices, weights)``, both ``(..., k)``.
    """
    logits = logits.astype(mx.float32)
    probs = mx.sigmoid(logits) if sigmoid else mx.softmax(logits, axis=-1, precise=True)
    choice = probs if choice_bias is None else probs + choice_bias.astype(mx.float32)
    indices = topk_indices(choice, k)
    weights = mx.take_along_axis(probs, indices, axis=-1)
    if normalize:
        weights = weights / mx.maximum(weights.sum(axis=-1, keepdims=True), norm_min)
    return indices, weights


def combine_experts(y, weights, dtype):
    """Weighted sum over the k experts of ``y (..., k, D)``, cast back to ``dtype``."""
    return (y * weights[..., None]).sum(axis=-2).astype(dtype)


@dataclass(frozen=True, eq=False)
class SharedExpert:
    """An always-on MLP beside the routed experts: ``mlp``, named ``name`` in the
    checkpoint; ``gated``: its output scaled by ``sigmoid(shared_expert_gate(x))``
    (Qwen 2 MoE)."""

    mlp: nn.Module
    name: str = "shared_expert"
    gated: bool = False

    def __post_init__(self):
        if not callable(self.mlp):
            raise ValueError(f"SharedExpert mlp must be a module, got {self.mlp!r}")
        if not (isinstance(self.name, str) and self.name):
            raise ValueError(f"SharedExpert name must be a name, got {self.name!r}")


class SparseMoE(nn.Module):
    """Softmax top-k routed experts (``gate``, ``switch_mlp``), optionally plus a
    :class:`SharedExpert`. Subclasses change the routing by overriding
    ``route(x) -> (indices, weights)``."""

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, activation="silu",
                 normalize=False, shared=None, switch=None):
        """``shared``: a :class:`SharedExpert` (None: none); ``switch``: the expert
        layer (default: gated ``SwitchGLU`` experts)."""
        super().__init__()
        if shared is not None and not isinstance(shared, SharedExpert):
            raise ValueError(f"SparseMoE shared must be a SharedExpert or None, got {shared!r}")
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.switch_mlp = switch or SwitchGLU(hidden_size, intermediate_size, num_experts,
                                              activation)
        self.top_k = top_k
        self.normalize = normalize
        self.shared_name = shared.name if shared is not None else None
        if shared is not None:
            setattr(self, shared.name, shared.mlp)
        if shared is not None and shared.gated:
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def route(self, x):
        return softmax_topk(self.gate(x), self.top_k, self.normalize)

    def __call__(self, x):
        indices, weights = self.route(x)
        y = combine_experts(self.switch_mlp(x, indices), weights, x.dtype)
        if self.shared_name is not None:
            shared = getattr(self, self.shared_name)(x)
            if "shared_expert_gate" in self:
                shared = mx.sigmoid(self.shared_expert_gate(x)) * shared
            y = y + shared
        return y


class InputScaledMoE(nn.Module):
    """Top-k experts whose sigmoid router score scales each expert's *input*, plus an
    always-on shared expert (Llama 4): ``shared(x) + sum_k expert_k(sigmoid(l_k) * x)``
    over the k largest router logits ``l_k``. Names follow the checkpoint: ``router``,
    ``experts`` (a ``SwitchGLU``), ``shared_expert``."""

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, shared,
                 activation="silu"):
        super().__init__()
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = SwitchGLU(hidden_size, intermediate_size, num_experts, activation)
        self.shared_expert = shared
        self.top_k = top_k

    def __call__(self, x):
        logits = self.router(x)
        indices = topk_indices(logits, self.top_k)
        top = mx.take_along_axis(logits, indices, axis=-1).astype(mx.float32)
        scores = mx.sigmoid(top).astype(x.dtype)
        # Each (token, expert) pair has its own input: route the pairs as tokens
        # with one expert each (x (..., k, D), indices (..., k, 1)).
        y = self.experts(x[..., None, :] * scores[..., None], indices[..., None])
        return y.squeeze(-2).sum(axis=-2) + self.shared_expert(x)
