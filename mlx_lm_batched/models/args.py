"""``BaseModelArgs``: an architecture's config dataclass built from a Hugging Face
``config.json``, with both RoPE config layouts read."""

import inspect
from dataclasses import dataclass


@dataclass
class BaseModelArgs:
    """Dataclass built from a Hugging Face ``config.json`` dict (unknown keys ignored)."""

    @classmethod
    def from_dict(cls, params):
        params = normalize_rope_config(params)
        # __init__'s, not the class's: a class may define __new__ (minimax dispatches)
        names = set(inspect.signature(cls.__init__).parameters) - {"self"}
        return cls(**{k: v for k, v in params.items() if k in names})


def normalize_rope_config(config):
    """Read RoPE settings from both config layouts found in the wild.

    transformers 4 writes ``rope_theta`` / ``rope_scaling`` at the top level;
    transformers 5 writes ``rope_parameters`` (with ``rope_theta`` inside), or one
    such dict per layer type (``full_attention``, ``sliding_attention``). The result
    always has the flat keys; per-type settings are also kept as
    ``rope_parameters_by_type`` and the sliding one as ``rope_local_base_freq``.
    """
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        return config
    config = dict(config)
    by_type = None
    if params and all(isinstance(v, dict) for v in params.values()):
        by_type = params
        params = by_type.get("full_attention") or next(iter(by_type.values()))
        config["rope_parameters_by_type"] = by_type
        local = by_type.get("sliding_attention")
        if local and "rope_theta" in local:
            config.setdefault("rope_local_base_freq", local["rope_theta"])
    if "rope_theta" in params:
        config.setdefault("rope_theta", params["rope_theta"])
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in (None, "default") and not config.get("rope_scaling"):
        config["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    for key in ("partial_rotary_factor",):
        if key in params:
            config.setdefault(key, params[key])
    return config


def take_alias(args, name, alias, required=True):
    """The value of field ``name``, or of ``alias`` (the same setting under mlx-lm's
    or the checkpoint's other name) when only that one is set. ValueError when both
    are set and differ, or (``required``) when neither is."""
    value, other = getattr(args, name), getattr(args, alias)
    if value is not None and other is not None and value != other:
        raise ValueError(f"{args.model_type}: {name}={value} and {alias}={other} differ "
                         f"(they name the same setting)")
    value = value if value is not None else other
    if value is None and required:
        raise ValueError(f"{args.model_type}: {name} (or {alias}) is required")
    return value


def require_values(args, **supported):
    """NotImplementedError naming the first field whose value this implementation does
    not have: mlx-lm's fields (and the checkpoints') that fix a variant are accepted,
    and checked, rather than ignored. ``supported``: field -> tuple of allowed values."""
    for name, allowed in supported.items():
        value = getattr(args, name)
        if value not in allowed:
            raise NotImplementedError(f"{args.model_type}: {name}={value!r} is not supported "
                                      f"(supported: {', '.join(map(repr, allowed))})")
