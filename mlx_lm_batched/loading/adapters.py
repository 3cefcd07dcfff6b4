"""Reading mlx-lm's adapter directories and attaching them to a loaded model.

The format is the one ``mlx_lm.lora`` writes: ``adapter_config.json``
(``fine_tune_type`` lora / dora / full, ``num_layers``, ``lora_parameters`` with
``rank``, ``scale``, ``dropout``, ``keys``) and ``adapters.safetensors``, whose keys name
the adapted layers by their path in the model (``model.layers.3.self_attn.q_proj.lora_a``,
``...lora_b``, DoRA's ``...m``; a full fine-tune stores the model's own parameters).
The trainer saves every adapted layer's weights, so the weights alone say which layers
an adapter changes; the config gives the scale and the kind.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..layers.lora import AdapterLinear, AdapterWeights, base_weight, fused_weight

ADAPTER_LEAVES = ("lora_a", "lora_b", "m")


@dataclass
class Adapter:
    """One adapter directory: its kind, its config and its weights by layer path
    (``layers``: :class:`AdapterWeights` per adapted linear layer; ``full``: the
    parameters of a full fine-tune)."""

    path: str
    kind: str
    config: dict
    layers: dict = field(default_factory=dict)
    full: dict = field(default_factory=dict)


def read_adapter(path):
    """Read an adapter directory (see the module docstring); ``ValueError`` with one
    line naming the problem for a missing or malformed one."""
    root = Path(path)
    config_file, weights_file = root / "adapter_config.json", root / "adapters.safetensors"
    for f in (config_file, weights_file):
        if not f.is_file():
            raise ValueError(f"adapter path '{path}' has no {f.name}")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} must hold a JSON object")
    kind = config.get("fine_tune_type", "lora")
    if kind not in ("lora", "dora", "full"):
        raise ValueError(f"{config_file}: fine_tune_type must be lora, dora or full, got {kind!r}")
    weights = mx.load(str(weights_file))
    if kind == "full":
        return Adapter(str(path), kind, config, full=weights)
    params = config.get("lora_parameters")
    if not isinstance(params, dict) or "scale" not in params:
        hint = " (mlx-lm's LoRA config uses 'scale', not 'alpha')" if isinstance(params, dict) \
            and "alpha" in params else ""
        raise ValueError(f"{config_file}: lora_parameters.scale is missing{hint}")
    scale = float(params["scale"])
    grouped = {}
    for name, w in weights.items():
        layer, _, leaf = name.rpartition(".")
        if leaf not in ADAPTER_LEAVES or not layer:
            raise ValueError(f"{weights_file}: '{name}' is not a LoRA/DoRA weight "
                             f"(lora_a, lora_b or m)")
        grouped.setdefault(layer, {})[leaf] = w
    layers = {}
    for layer, parts in grouped.items():
        if "lora_a" not in parts or "lora_b" not in parts:
            raise ValueError(f"{weights_file}: layer '{layer}' lacks lora_a or lora_b")
        if "m" in parts and kind != "dora":
            raise ValueError(f"{weights_file}: layer '{layer}' has DoRA's 'm' but "
                             f"fine_tune_type is {kind!r}")
        layers[layer] = AdapterWeights(parts["lora_a"], parts["lora_b"], scale, parts.get("m"))
    return Adapter(str(path), kind, config, layers=layers)


def _dora_default_magnitudes(model, adapter):
    """DoRA layers saved without ``m`` keep the base weight's row norms (mlx-lm's start)."""
    if adapter.kind != "dora":
        return adapter.layers
    modules = dict(model.named_modules())
    out = {}
    for name, w in adapter.layers.items():
        if w.m is None and name in modules:
            m = mx.linalg.norm(base_weight(modules[name]).astype(mx.float32), axis=1)
            w = AdapterWeights(w.a, w.b, w.scale, m)
        out[name] = w
    return out


def attach_adapters(model, paths, default_slot=0):
    """Give ``model`` the adapters in directories ``paths`` as slots ``1..n`` of its
    linear layers (see ``layers.lora``); rows outside ``adapter_rows`` use
    ``default_slot``. LoRA and DoRA only (a full fine-tune replaces the weights and
    cannot share a batch). Returns the :class:`Adapter` list."""
    adapters = [read_adapter(p) for p in paths]
    for a in adapters:
        if a.kind == "full":
            raise ValueError(f"adapter '{a.path}' is a full fine-tune: load it alone "
                             f"(load(..., adapter_path=...)), it cannot share a batch")
    modules = dict(model.named_modules())
    per_adapter = [_dora_default_magnitudes(model, a) for a in adapters]
    names = sorted({n for layers in per_adapter for n in layers})
    replaced = []
    for name in names:
        base = modules.get(name)
        if base is None:
            raise ValueError(f"adapter layer '{name}' is not a module of this model")
        if isinstance(base, AdapterLinear):
            raise ValueError(f"layer '{name}' already has adapters: attach them in one call")
        if not isinstance(base, (nn.Linear, nn.QuantizedLinear)):
            raise ValueError(f"adapter layer '{name}' is a {type(base).__name__}; adapters "
                             f"apply to Linear and QuantizedLinear layers here")
        try:
            replaced.append((name, AdapterLinear(base, [layers.get(name) for layers in per_adapter],
                                                 default_slot)))
        except ValueError as e:
            raise ValueError(f"adapter layer '{name}': {e}") from None
    model.update_modules(tree_unflatten(replaced))
    mx.eval(model.parameters())
    return adapters


def load_adapters(model, path):
    """mlx-lm's ``load_adapters``: apply the adapter in ``path`` to every row of
    ``model`` (LoRA/DoRA as slot 1 by default; a full fine-tune's weights replace the
    model's, checked by name and shape)."""
    adapter = read_adapter(path)
    if adapter.kind != "full":
        attach_adapters(model, [path], default_slot=1)
        return model
    params = dict(tree_flatten(model.parameters()))
    for name, w in adapter.full.items():
        if name not in params:
            raise ValueError(f"adapter '{path}': '{name}' is not a parameter of the model")
        if w.shape != params[name].shape:
            raise ValueError(f"adapter '{path}': '{name}' has shape {tuple(w.shape)}, the "
                             f"model's is {tuple(params[name].shape)}")
    model.load_weights(list(adapter.full.items()), strict=False)
    return model


def fuse_adapters(model, dequantize=False):
    """Fold a model's single adapter into its weights (mlx-lm's ``fuse``): every
    ``AdapterLinear`` becomes a plain linear layer, quantized again like its base unless
    ``dequantize``. Refuses layers holding several adapters (nothing says which)."""
    fused = []
    for name, module in model.named_modules():
        if not isinstance(module, AdapterLinear):
            continue
        held = module.adapter_weights.items
        if len(held) != 1:
            raise ValueError(f"layer '{name}' holds {len(held)} adapters: fuse needs one")
        base = module.linear
        weight = fused_weight(base, held[0])
        has_bias = "bias" in base
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias)
        linear.weight = weight
        if has_bias:
            linear.bias = base.bias
        if isinstance(base, nn.QuantizedLinear) and not dequantize:
            linear = nn.QuantizedLinear.from_linear(linear, base.group_size, base.bits,
                                                    mode=base.mode)
        fused.append((name, linear))
    if fused:
        model.update_modules(tree_unflatten(fused))
    return model
