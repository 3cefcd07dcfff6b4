"""Convert a Hugging Face model (directory or repo) or a GGUF file to an MLX directory.

The output keeps Hugging Face weight names and writes ``config.json`` (with
mlx-lm's ``quantization`` entry when quantized), ``model.safetensors`` and the
tokenizer files, so it loads here, in mlx-lm, and (when saved as floats) in
transformers.
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .utils import (
    ModelLoadError,
    dequantize_model,
    get_model_path,
    load_config,
    load_weights,
    model_from_weights,
)

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
TOKENIZER_FILES = [
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "generation_config.json", "chat_template.jinja", "chat_template.json", "vocab.json",
    "merges.txt", "added_tokens.json",
]
MAX_SHARD_BYTES = 5 << 30


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


def _save_weights(out, weights):
    shards, current, size = [], {}, 0
    for k, v in weights.items():
        if current and size + v.nbytes > MAX_SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[k] = v
        size += v.nbytes
    shards.append(current)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    index = {"metadata": {"total_size": sum(v.nbytes for v in weights.values())}, "weight_map": {}}
    for name, shard in zip(names, shards):
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        index["weight_map"].update({k: name for k in shard})
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    with open(out / "model.safetensors.index.json", "w") as f:
        json.dump(index, f, indent=2)


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
    ``dequantize``: turn a quantized source into floats. Returns the output path.
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
        from .utils import cast_floats

        cast_floats(model, float_dtype)
        config["torch_dtype"] = config["dtype"] = dtype
    if quantize:
        group_size, bits = q_group_size or 64, q_bits or 4

        def predicate(path, module):
            if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
                return False
            return quant_predicate(path, module, config) if quant_predicate else True

        nn.quantize(model, group_size=group_size, bits=bits, mode=q_mode, class_predicate=predicate)
        config["quantization"] = {"group_size": group_size, "bits": bits, "mode": q_mode}
    if "quantization" in config:
        config["quantization_config"] = config["quantization"]
    out.mkdir(parents=True, exist_ok=True)
    _save_weights(out, dict(tree_flatten(model.parameters())))
    with open(out / "config.json", "w") as f:
        json.dump(dict(sorted(config.items())), f, indent=2)
    write_tokenizer(out)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description="Convert a Hugging Face model or GGUF to MLX.")
    parser.add_argument("--hf-path", "--model", required=True, help="HF directory, repo id or .gguf file")
    parser.add_argument("--mlx-path", default="mlx_model", help="output directory")
    parser.add_argument("-q", "--quantize", action="store_true")
    parser.add_argument("--q-group-size", type=int, default=None)
    parser.add_argument("--q-bits", type=int, default=None)
    parser.add_argument("--dtype", choices=list(DTYPES), default=None)
    parser.add_argument("-d", "--dequantize", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = convert(args.hf_path, args.mlx_path, args.quantize, args.q_group_size, args.q_bits,
                      dtype=args.dtype, dequantize=args.dequantize)
    except (ValueError, OSError, NotImplementedError) as e:
        parser.exit(1, f"error: {e}\n")
    print(f"[convert] wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
