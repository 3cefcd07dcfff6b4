"""A ``config.json`` checked against an architecture's ``ModelArgs`` before anything is
built: missing required keys, values of the wrong JSON type, sizes below 1."""

import collections.abc
import dataclasses
import typing

from ..sampling.params import is_int, is_real

# config.json against an architecture's ModelArgs
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
             "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings")


def _matches(value, tp) -> bool:
    """Whether ``value`` fits the annotation ``tp`` (unknown annotations accept anything)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:  # JSON written by hand or old tools may say 0/1
        return isinstance(value, bool) or (is_int(value) and value in (0, 1))
    if tp is int:
        return is_int(value)
    if tp is float:
        return is_real(value)
    if tp is str:
        return isinstance(value, str)
    if tp is dict or origin is dict:
        return isinstance(value, dict)
    if tp in (list, tuple) or origin in (list, tuple, collections.abc.Sequence):
        return isinstance(value, (list, tuple))
    return True


def check_config_fields(args_cls, config: dict, source: str):
    """Check ``config`` against the dataclass ``args_cls`` (an architecture's ModelArgs).

    ``ValueError`` naming ``source`` (the config file) and the key for: a required
    key that is missing, a value of the wrong JSON type, a size that is not >= 1.
    """
    if not dataclasses.is_dataclass(args_cls):
        return
    try:
        hints = typing.get_type_hints(args_cls)
    except Exception:  # unresolvable annotations: skip the type checks, not the load
        hints = {}
    model_type = config.get("model_type")
    for f in dataclasses.fields(args_cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in config:
            if required and f.init:
                raise ValueError(f"{source}: missing required key '{f.name}' "
                                 f"for model_type '{model_type}'")
            continue
        value, tp = config[f.name], hints.get(f.name)
        if value is None and not required:
            continue  # hub configs write null for "use the default"; the code handles it
        if tp is not None and not _matches(value, tp):
            want = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
            raise ValueError(f"{source}: '{f.name}' must be {want}, "
                             f"got {type(value).__name__} {value!r:.60}")
        if f.name in SIZE_KEYS and is_int(value) and value < 1:
            raise ValueError(f"{source}: '{f.name}' must be an integer >= 1, got {value}")
