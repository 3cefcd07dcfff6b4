"""What ``convert`` adds so that mlx-lm 0.32 loads its output too.

transformers 5 writes RoPE settings under ``rope_parameters`` and renamed some MoE keys;
mlx-lm 0.32 reads the transformers 4 top-level keys only (and silently falls back to
``rope_theta=10000`` without them). The converted ``config.json`` keeps every key it had
(this package reads both layouts) and gains mlx-lm's where they are missing. Qwen3.5's
text-only model_types, which mlx-lm lacks, are written as the multimodal ones it has (both
load a flat text config, here and there), with the layer placement and RoPE it reads.

Weight names: this package's modules use Hugging Face's names, which mlx-lm's ``sanitize``
methods also read, except where mlx-lm's differ (``mlx_lm_weights``); loading maps those
back (``from_mlx_lm_weights``), so both kinds of checkpoint load here. Qwen3.5 keeps
Hugging Face's ``(C, 1, K)`` convolutions and zero-centred norms: mlx-lm's ``sanitize``
takes that layout as a Hugging Face checkpoint and shifts the norms to its ``1 + w``.
"""

import re
import warnings

# model_type -> (transformers 5 key, the key mlx-lm's ModelArgs reads)
_RENAMED_KEYS = {
    "qwen3_moe": (("num_local_experts", "num_experts"),),
    "qwen2_moe": (("num_local_experts", "num_experts"),),
    "olmoe": (("num_local_experts", "num_experts"),),
}


def mlx_lm_config(config, args=None):
    """``config`` plus the top-level keys mlx-lm 0.32 reads (a new dict); ``args``: the
    ``ModelArgs`` this package built from it (the settings its model actually runs with).
    Warns, in one line, where mlx-lm cannot represent the checkpoint."""
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
            _add_global_layer_keys(c)
    if out.get("model_type") in QWEN3_5_TYPES:
        _qwen3_5_config(out, args)
    if out.get("model_type") == "gemma4" and isinstance(text, dict):
        # mlx-lm's gemma4 sets the text model's vocabulary from the top level
        out.setdefault("vocab_size", text.get("vocab_size"))
    return out


# transformers 5's per-layer key -> mlx-lm's key for Gemma 4's full-attention layers
_GLOBAL_KEYS = (("head_dim", "global_head_dim"),
                ("num_key_value_heads", "num_global_key_value_heads"))


def _add_global_layer_keys(config):
    """Gemma 4's ``global_head_dim`` and ``num_global_key_value_heads`` (mlx-lm's keys)
    from transformers 5's ``per_layer_config`` (``{layer: {"head_dim": d, ...}}`` for the
    full-attention layers)."""
    per_layer = config.get("per_layer_config")
    if not isinstance(per_layer, dict):
        return
    types = config.get("layer_types") or []
    entries = [v for k, v in per_layer.items() if isinstance(v, dict) and not (
        str(k).isdigit() and int(k) < len(types) and types[int(k)] != "full_attention")]
    for theirs, mlx_lm in _GLOBAL_KEYS:
        values = {v.get(theirs) for v in entries}
        if mlx_lm not in config and len(values) == 1 and None not in values:
            config[mlx_lm] = values.pop()


# Qwen3.5's text-only model_types -> the one mlx-lm 0.32 has a module for (its
# ``qwen3_5``/``qwen3_5_moe`` take the flat text config as well as ``text_config``)
QWEN3_5_TYPES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe",
                 "qwen3_5": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe"}


def _qwen3_5_config(out, args):
    """mlx-lm's Qwen3.5 model_type, its ``full_attention_interval`` (it ignores
    ``layer_types``) and its ``rope_parameters`` (the only RoPE key it reads; without it,
    theta 100000): the settings ``args`` holds, written into the text settings."""
    out["model_type"] = QWEN3_5_TYPES[out["model_type"]]
    text = out["text_config"] if isinstance(out.get("text_config"), dict) else out
    if args is None:
        return
    problem = None
    interval = _full_attention_interval(args.layer_types)
    if interval is None:
        problem = f"layer_types {args.layer_types} are not every n-th layer full attention"
    else:
        text["full_attention_interval"] = interval
    if getattr(args, "num_experts", 0) and not all(map(args.is_moe_layer,
                                                       range(args.num_hidden_layers))):
        problem = "some layers have a dense MLP (mlx-lm's has experts in every layer)"
    if problem:
        warnings.warn(f"mlx-lm 0.32 cannot load this {out['model_type']} checkpoint "
                      f"correctly: {problem}; it loads in mlx_lm_batched", stacklevel=3)
    scaling = dict(args.rope_scaling or {})
    kind = scaling.get("type") or scaling.get("rope_type") or "default"
    text["rope_parameters"] = {**(text.get("rope_parameters") or {}), **scaling, "type": kind,
                               "rope_theta": args.rope_theta,
                               "partial_rotary_factor": args.partial_rotary_factor}
    text["rope_parameters"].pop("rope_type", None)


def _full_attention_interval(layer_types):
    """``n`` such that exactly the layers ``n-1, 2n-1, ...`` are full attention."""
    n = len(layer_types)
    for interval in range(1, n + 1):
        if all((t == "full_attention") == ((i + 1) % interval == 0)
               for i, t in enumerate(layer_types)):
            return interval
    return None  # (no full-attention layer at all: mlx-lm's mask lookup needs one)


def _add_rope_keys(config):
    """``rope_theta`` (``partial_rotary_factor``, and ``rope_scaling`` for a scaled RoPE)
    from a one-kind ``rope_parameters`` (per-layer-type parameters, Gemma 3's, stay as they are)."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" not in params:
        return
    config.setdefault("rope_theta", params["rope_theta"])
    if "partial_rotary_factor" in params:  # Phi's: mlx-lm reads it at the top level only
        config.setdefault("partial_rotary_factor", params["partial_rotary_factor"])
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

# model_type -> (this package's module name, Hugging Face's and mlx-lm's) where the shared
# layers name a module otherwise (Phi's attention output is ``dense`` there, its last norm
# ``final_layernorm``); the model's ``sanitize`` reads both.
_RENAMED_MODULES = {"phi": ((".self_attn.o_proj.", ".self_attn.dense."),
                            ("model.norm.", "model.final_layernorm."))}


def mlx_lm_weights(model_type, weights):
    """``weights`` (this package's parameter names) under mlx-lm 0.32's names for
    ``model_type``; :func:`from_mlx_lm_weights` and the models' ``sanitize`` read them
    back."""
    if model_type in _SWITCH_GLU_EXPERTS:
        weights = {_EXPERTS.sub(r".experts.switch_glu.\1.", k): v for k, v in weights.items()}
    for ours, theirs in _RENAMED_MODULES.get(model_type, ()):
        weights = {k.replace(ours, theirs): v for k, v in weights.items()}
    if model_type in _LANGUAGE_MODEL_PREFIX:
        weights = {f"language_model.{k}": v for k, v in weights.items()}
    return weights


def from_mlx_lm_weights(model_type, weights):
    """Sanitized ``weights`` with mlx-lm's names this package's modules do not use
    mapped to theirs (a checkpoint converted by mlx-lm or by ``convert``)."""
    if model_type in _SWITCH_GLU_EXPERTS:
        weights = {_SWITCH_GLU.sub(r".experts.\1.", k): v for k, v in weights.items()}
    return weights


def _module_path(model_type, name):
    """This package's path of the module mlx-lm's checkpoint names ``name``."""
    if name.startswith("language_model."):  # mlx-lm's multimodal models hold the text
        name = name[len("language_model."):]  # model under it; transformers 5 nests it
        name = name if name.startswith(("model.", "lm_head")) else f"model.{name}"
    elif name.startswith("model.language_model."):
        name = "model." + name[len("model.language_model."):]
    name = _SWITCH_GLU.sub(r".experts.\1.", name + ".")[:-1]
    for ours, theirs in _RENAMED_MODULES.get(model_type, ()):
        name = name.replace(theirs, ours)
    return name


def module_quantization(model_type, qconfig):
    """``qconfig`` (mlx-lm's ``quantization``) with each per-module entry also under
    this package's path of that module, so a mixed-bit checkpoint's overrides keyed by
    mlx-lm's names (``language_model.model.*``, ``experts.switch_glu.*``) reach the
    modules they name here; an entry already under this package's path wins."""
    out = dict(qconfig)
    for name, value in qconfig.items():
        if isinstance(value, dict) or value is False:
            out.setdefault(_module_path(model_type, name), value)
    return out
