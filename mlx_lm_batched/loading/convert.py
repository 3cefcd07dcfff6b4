"""Convert a Hugging Face model (directory or repo) or a GGUF file to an MLX directory
(the command line is ``cli/convert.py``).

The output holds mlx-lm's weight names (Hugging Face's where they agree; see
``mlx_lm_layout.py``) and writes ``config.json`` (with mlx-lm's ``quantization`` entry
when quantized, and the top-level keys mlx-lm reads), ``model.safetensors`` and the
tokenizer files, so it loads here and in mlx-lm.
"""

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from .dequantize import cast_floats, dequantize_model
from .load import (
    ModelLoadError,
    get_model_path,
    load_config,
    load_weights,
    model_from_weights,
)
from .mlx_lm_layout import mlx_lm_config, mlx_lm_weights
from .quant_recipes import mixed_quant_predicate_builder
from .save import TOKENIZER_FILES, quantize_model, save_weights

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def _dtype(name):
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"unknown dtype '{name}' (choose from {', '.join(DTYPES)})")
    return DTYPES[name]


def _read_source(hf_path, revision, float_dtype):
    """Weights (HF names), config and a tokenizer writer for a GGUF or an HF model."""
    if str(hf_path).endswith(".gguf"):
        from .gguf import read_gguf
        from .gguf_tokenizer import save_gguf_tokenizer

        if not Path(hf_path).is_file():
            raise ModelLoadError(f"GGUF file '{hf_path}' does not exist")
        weights, config, _ = read_gguf(hf_path, dtype=float_dtype)
        return weights, config, lambda out: save_gguf_tokenizer(hf_path, str(out))
    src = get_model_path(str(hf_path), revision)
    config = load_config(src)

    def copy_tokenizer(out):
        for name in TOKENIZER_FILES:
            if (src / name).exists():
                shutil.copy(src / name, out / name)

    return load_weights(src), config, copy_tokenizer


def convert(
    hf_path,
    mlx_path="mlx_model",
    quantize=False,
    q_group_size=None,
    q_bits=None,
    q_mode="affine",
    dtype=None,
    upload_repo=None,
    revision=None,
    dequantize=False,
    quant_predicate=None,
    trust_remote_code=False,
):
    """Write an MLX model directory for ``hf_path`` (HF directory, repo id or ``.gguf``).

    ``quantize``: affine-quantize Linear/Embedding weights (``q_bits`` 4 by
    default, ``q_group_size`` 64). ``dtype``: float type of the unquantized
    weights (for a GGUF, also dequantizes its quantized tensors).
    ``dequantize``: turn a quantized source into floats. ``quant_predicate``: a recipe
    name of ``QUANT_RECIPES`` (mixed bit widths) or mlx-lm's ``(path, module) -> bool |
    dict`` per layer. Returns the output path.
    """
    if upload_repo is not None:
        raise NotImplementedError("uploading to the hub is not supported")
    if quantize and dequantize:
        raise ValueError("choose either quantize or dequantize, not both")
    out = Path(mlx_path)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"output directory '{out}' already exists and is not empty")
    float_dtype = _dtype(dtype)
    is_gguf = str(hf_path).endswith(".gguf")
    # Re-quantizing or dequantizing a GGUF starts from floats.
    read_dtype = float_dtype or (mx.float32 if is_gguf and (quantize or dequantize) else None)
    weights, config, write_tokenizer = _read_source(hf_path, revision, read_dtype)
    model = model_from_weights(config, weights)
    del weights
    if dequantize:
        model = dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    if float_dtype is not None:
        cast_floats(model, float_dtype)
        config["torch_dtype"] = config["dtype"] = dtype
    if quantize:
        if isinstance(quant_predicate, str):  # a recipe name, as mlx-lm's --quant-predicate
            if q_mode != "affine":
                raise ValueError("quantization recipes (quant_predicate) are affine only: "
                                 f"drop q_mode={q_mode!r} or the recipe")
            quant_predicate = mixed_quant_predicate_builder(quant_predicate, model,
                                                            q_group_size or 64)
        # quant_predicate(path, module) -> bool or per-layer parameters, as mlx-lm calls it
        model, config = quantize_model(model, config, q_group_size, q_bits, mode=q_mode,
                                       quant_predicate=quant_predicate)
    elif quant_predicate is not None:
        raise ValueError("quant_predicate without quantize: add --quantize (-q)")
    if "quantization" in config:
        config["quantization_config"] = config["quantization"]
    out.mkdir(parents=True, exist_ok=True)
    save_weights(out, mlx_lm_weights(config.get("model_type"), dict(tree_flatten(model.parameters()))))
    with open(out / "config.json", "w") as f:
        json.dump(dict(sorted(mlx_lm_config(config, getattr(model, "args", None)).items())), f,
                  indent=2)
    write_tokenizer(out)
    return out
