"""Writing models (mlx-lm's ``save_model``, ``save_config``, ``save``, ``quantize_model``
on this module's weight writer ``save_weights``), loading a tokenizer by path and
counting parameters."""

import json
import math
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

from .load import get_model_path

TOKENIZER_FILES = [
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "generation_config.json", "chat_template.jinja", "chat_template.json", "vocab.json",
    "merges.txt", "added_tokens.json",
]


MAX_SHARD_BYTES = 5 << 30


def make_shards(weights, max_file_size_gb=MAX_SHARD_BYTES >> 30):
    """Split ``weights`` (a dict of arrays), in order, into dicts of at most
    ``max_file_size_gb`` GiB each (mlx-lm's); a larger tensor gets a shard of its own,
    and no weights give no shard."""
    limit = max_file_size_gb << 30
    shards, current, size = [], {}, 0
    for k, v in weights.items():
        if current and size + v.nbytes > limit:
            shards.append(current)
            current, size = {}, 0
        current[k] = v
        size += v.nbytes
    if current:
        shards.append(current)
    return shards


def save_weights(out, weights):
    """Write ``weights`` (a dict of arrays) into directory ``out``: ``model.safetensors``,
    or shards of at most ``MAX_SHARD_BYTES`` with ``model.safetensors.index.json``."""
    shards = make_shards(weights) or [{}]  # no weights: one empty file
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    index = {"metadata": {"total_size": sum(v.nbytes for v in weights.values())}, "weight_map": {}}
    for name, shard in zip(names, shards):
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        index["weight_map"].update({k: name for k in shard})
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    with open(out / "model.safetensors.index.json", "w") as f:
        json.dump(index, f, indent=2)


def load_tokenizer(model_path, tokenizer_config_extra=None, eos_token_ids=None):
    """Load the tokenizer of a model directory or hub repo (mlx-lm's ``utils.load_tokenizer``):
    a ``TokenizerWrapper`` with a streaming detokenizer; ``eos_token_ids`` (int or list)
    are stop ids in addition to the tokenizer's own EOS token."""
    from ..tokenization.tokenizer import load_tokenizer as load
    from ..tool_parsers import tool_markup

    return load(get_model_path(str(model_path)), tokenizer_config_extra,
                eos_token_ids=eos_token_ids, tool_markup=tool_markup)


def common_prefix_len(list1, list2):
    """Length of the common prefix of two sequences (mlx-lm's helper)."""
    n = 0
    for a, b in zip(list1, list2):
        if a != b:
            break
        n += 1
    return n


def get_total_parameters(model):
    """Number of parameters of ``model``; quantized layers count their unpacked weights
    (and not their scales and biases)."""
    total = 0
    for _, module in tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module)):
        params = dict(tree_flatten(module.parameters()))
        bits = getattr(module, "bits", None)
        if bits:  # packed: 32 // bits values per uint32; scales/biases are overhead
            total += params["weight"].size * 32 // bits
            total += params["bias"].size if "bias" in params else 0
        else:
            total += sum(v.size for v in params.values())
    return total


def save_model(save_path, model, *, donate_model=False):
    """Write ``model``'s weights (``model.safetensors`` or shards, and the index) into
    directory ``save_path`` (created if needed). ``donate_model=True`` drops the
    model's arrays once they are collected, so they can be freed while writing."""
    out = Path(save_path)
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    if donate_model:
        model.update(tree_map(lambda _: mx.array([]), model.parameters()))
    save_weights(out, weights)


def save_config(config, config_path):
    """Write ``config`` (a dict) as sorted JSON; ``quantization`` is mirrored to
    ``quantization_config`` as Hugging Face tools expect."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    config = dict(config)
    config.pop("_name_or_path", None)
    if "quantization" in config:
        config["quantization_config"] = config["quantization"]
    with open(config_path, "w") as f:
        json.dump(_tag_floats(dict(sorted(config.items()))), f, indent=4)


def _tag_floats(value):
    """``value`` with each non-finite float as transformers writes it
    (``{"__float__": "Infinity"}``), so that every JSON parser reads the file;
    ``load_config`` turns the tags back into floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": "NaN" if math.isnan(value)
                else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, dict):
        return {k: _tag_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tag_floats(v) for v in value]
    return value


def quantize_model(model, config, group_size, bits, mode="affine", global_scale=False,
                   quant_predicate=None):
    """Quantize ``model``'s Linear/Embedding layers in place (mlx-lm's signature).

    ``group_size`` / ``bits`` default to 64 / 4 when None. Layers whose input size is
    not a multiple of the group size stay float. ``quant_predicate(path, module)``
    may return False (keep float), True, or a dict of ``to_quantized`` parameters.
    Returns ``(model, config)`` with ``config["quantization"]`` set (a new dict).
    ``global_scale`` raises ``NotImplementedError`` (no nvfp4 switch layers here).
    """
    if global_scale:
        raise NotImplementedError("global_scale (nvfp4 expert scales) is not supported")
    group_size, bits = group_size or 64, bits or 4
    config = dict(config)
    per_layer = {}

    def predicate(path, module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        choice = quant_predicate(path, module) if quant_predicate else True
        if isinstance(choice, dict):
            per_layer[path] = choice
        return choice

    nn.quantize(model, group_size=group_size, bits=bits, mode=mode, class_predicate=predicate)
    config["quantization"] = {"group_size": group_size, "bits": bits, "mode": mode, **per_layer}
    config["quantization_config"] = config["quantization"]
    return model, config


def save(dst_path, src_path_or_repo, model, tokenizer, config, donate_model=True):
    """Write a loadable model directory: weights, ``config.json``, the tokenizer and,
    from ``src_path_or_repo`` when it is a local directory, ``generation_config.json``
    and the other tokenizer files the tokenizer does not write itself."""
    dst = Path(dst_path)
    save_model(dst, model, donate_model=donate_model)
    save_config(config, dst / "config.json")
    tokenizer.save_pretrained(str(dst))
    src = Path(src_path_or_repo)
    if src.is_dir():
        for name in TOKENIZER_FILES:
            if (src / name).exists() and not (dst / name).exists():
                shutil.copy(src / name, dst / name)
