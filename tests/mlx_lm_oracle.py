"""mlx-lm 0.32 as the oracle for families transformers 5.24 has no model for.

mlx-lm's own module for the family is built from the tiny config, given random
weights, and saved the way mlx-lm's conversions store them (its parameter names,
``config.json`` with top-level RoPE keys); our loader reads that directory and the
logits are compared with mlx-lm's model run on each prompt alone. mlx-lm is a test
oracle only: the package never imports it.
"""

import importlib
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten


def build_mlx_lm_model(model_type, config, seed=0, std=0.3):
    """mlx-lm's ``model_type`` model from ``config`` with N(0, std) weights."""
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    model = module.Model(module.ModelArgs.from_dict(dict(config, model_type=model_type)))
    key = mx.random.key(seed)
    params = tree_flatten(model.parameters())
    keys = mx.random.split(key, len(params))
    model.update(tree_unflatten([(name, mx.random.normal(p.shape, key=k) * std)
                                 for (name, p), k in zip(params, keys)]))
    mx.eval(model.parameters())
    return model


def to_rope_parameters(config):
    """The transformers-5 layout of a flat config: RoPE keys under ``rope_parameters``."""
    config = dict(config)
    if isinstance(config.get("text_config"), dict):  # multimodal: the text model's keys
        config["text_config"] = to_rope_parameters(config["text_config"])
    if "rope_theta" not in config:  # the family's own default stays in force
        return config
    params = {"rope_theta": config.pop("rope_theta")}
    scaling = config.pop("rope_scaling", None) or {"rope_type": "default"}
    params.update(scaling)
    config["rope_parameters"] = params
    return config


def save_mlx_lm_model(model, config, directory, layout):
    """Weights under mlx-lm's names and ``config`` in ``layout``."""
    directory = Path(directory)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    if layout == "transformers5":
        config = to_rope_parameters(config)
    elif layout != "transformers4":
        raise ValueError(f"unknown layout {layout}")
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def mlx_lm_logits(model, prompt):
    """mlx-lm's logits for one prompt alone, as float32 numpy."""
    import numpy as np

    return np.array(model(mx.array([prompt]))[0].astype(mx.float32))
