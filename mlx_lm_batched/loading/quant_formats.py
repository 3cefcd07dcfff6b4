"""MLX quantization settings of checkpoints quantized in other containers' configs."""

# compressed-tensors ``format`` -> the MLX quantization its packed weights are.
_COMPRESSED_TENSORS = {
    "nvfp4-pack-quantized": {"group_size": 16, "bits": 4, "mode": "nvfp4"},
    "mxfp4-pack-quantized": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
    "pack-quantized": {"group_size": 32, "bits": 4, "mode": "affine"},
}


def compressed_tensors_quantization(quantization_config):
    """mlx-lm's ``_compressed_tensors_quantization``: the MLX settings of a
    ``quant_method: compressed-tensors`` config's packed integer ``format``; any other
    format (``float-quantized`` FP8 ...) raises ``ValueError`` in one line instead of
    being read as 4-bit affine."""
    fmt = quantization_config.get("format")
    if fmt not in _COMPRESSED_TENSORS:
        raise ValueError(f"unsupported compressed-tensors format {fmt!r} (supported: "
                         f"{', '.join(_COMPRESSED_TENSORS)}); dequantize to bf16 before "
                         "converting")
    return dict(_COMPRESSED_TENSORS[fmt])
