"""What ``convert`` adds so that mlx-lm 0.32 loads its output too.

transformers 5 writes RoPE settings under ``rope_parameters`` and renamed some MoE keys;
mlx-lm 0.32 reads the transformers 4 top-level keys only (and silently falls back to
``rope_theta=10000`` without them). The converted ``config.json`` keeps every key it had
(this package reads both layouts) and gains mlx-lm's where they are missing.


Weight names: this package's modules use Hugging Face's names, which mlx-lm's ``sanitize``
methods also read, except where mlx-lm's differ (``mlx_lm_weights``); loading maps those
back (``from_mlx_lm_weights``), so both kinds of checkpoint load here.
"""

import re

# model_type -> (transformers 5 key, the key mlx-lm's ModelArgs reads)
_RENAMED_KEYS = {
    "qwen3_moe": (("num_local_experts", "num_experts"),),
    "qwen2_moe": (("num_local_experts", "num_experts"),),
    "olmoe": (("num_local_experts", "num_experts"),),
}


def mlx_lm_config(config):
    """``config`` plus the top-level keys mlx-lm 0.32 reads (a new dict)."""
    out = dict(config)
    _add_rope_keys(out)
    text = out.get("text_config")
    if isinstance(text, dict):
        out["text_config"] = dict(text)
        _add_rope_keys(out["text_config"])
    for new, old in _RENAMED_KEYS.get(out.get("model_type"), ()):
        if new in out and old not in out:
            out[old] = out[new]
    for c in (out, out.get("text_config")):
        if isinstance(c, dict):
            _add_global_head_dim(c)
    if out.get("model_type") == "gemma4" and isinstance(text, dict):
        # mlx-lm's gemma4 sets the text model's vocabulary from the top level
        out.setdefault("vocab_size", text.get("vocab_size"))
    return out


def _add_global_head_dim(config):
    """Gemma 4's ``global_head_dim`` (mlx-lm's key) from transformers 5's
    ``per_layer_config`` (``{layer: {"head_dim": d}}`` for the full-attention layers)."""
    per_layer = config.get("per_layer_config")
    if not isinstance(per_layer, dict) or "global_head_dim" in config:
        return
    dims = {v.get("head_dim") for v in per_layer.values() if isinstance(v, dict)}
    if len(dims) == 1 and None not in dims:
        config["global_head_dim"] = dims.pop()


def _add_rope_keys(config):
    """``rope_theta`` (and ``rope_scaling`` for a scaled RoPE) from a one-kind
    ``rope_parameters`` (per-layer-type parameters, Gemma 3's, stay as they are)."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" not in params:
        return
    config.setdefault("rope_theta", params["rope_theta"])
    if params.get("rope_type", "default") != "default" and "rope_scaling" not in config:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        scaling.setdefault("type", scaling["rope_type"])
        config["rope_scaling"] = scaling


# model_types whose mlx-lm Model keeps the text model under ``language_model`` (its
# sanitize reads ``language_model.*`` or transformers' ``model.language_model.*``, never
# the text family's bare ``model.*`` this package's modules hold)
_LANGUAGE_MODEL_PREFIX = {"gemma4"}


# model_types whose stacked experts mlx-lm holds in a ``switch_glu`` module inside
# ``experts`` (Gemma 4's expert block); this package's ``experts`` holds them directly
_SWITCH_GLU_EXPERTS = {"gemma4", "gemma4_text"}
_EXPERTS = re.compile(r"\.experts\.(gate_proj|up_proj|down_proj)\.")
_SWITCH_GLU = re.compile(r"\.experts\.switch_glu\.(gate_proj|up_proj|down_proj)\.")


def mlx_lm_weights(model_type, weights):
    """``weights`` (this package's parameter names) under mlx-lm 0.32's names for
    ``model_type``; :func:`from_mlx_lm_weights` and the models' ``sanitize`` read them
    back."""
    if model_type in _SWITCH_GLU_EXPERTS:
        weights = {_EXPERTS.sub(r".experts.switch_glu.\1.", k): v for k, v in weights.items()}
    if model_type in _LANGUAGE_MODEL_PREFIX:
        weights = {f"language_model.{k}": v for k, v in weights.items()}
    return weights


def from_mlx_lm_weights(model_type, weights):
    """Sanitized ``weights`` with mlx-lm's names this package's modules do not use
    mapped to theirs (a checkpoint converted by mlx-lm or by ``convert``)."""
    if model_type in _SWITCH_GLU_EXPERTS:
        weights = {_SWITCH_GLU.sub(r".experts.\1.", k): v for k, v in weights.items()}
    return weights
