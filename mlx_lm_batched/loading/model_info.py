"""Small questions about a model or checkpoint that mlx-lm's ``utils`` answers:
bits per weight, whether ``__call__`` takes ``input_embeddings``, the quantization a
saved weight was packed with, whether Metal kernels can run; and its Hub uploads,
which this package refuses with one line."""

import inspect

import mlx.core as mx
from mlx.utils import tree_reduce

from .save import get_total_parameters


def compute_bits_per_weight(model):
    """Bytes of every array the model holds, in bits, per parameter (quantized layers
    count their unpacked weights; ``get_total_parameters``)."""
    nbytes = tree_reduce(lambda acc, x: acc + x.nbytes if isinstance(x, mx.array) else acc,
                         model, 0)
    return nbytes * 8 / get_total_parameters(model)


def does_model_support_input_embeddings(model):
    """True when ``model.__call__`` has an ``input_embeddings`` parameter."""
    try:
        return "input_embeddings" in inspect.signature(model.__call__).parameters
    except (TypeError, ValueError):
        return False


def can_run_metal():
    """True when the default device is the GPU and Metal is available."""
    return mx.default_device() == mx.gpu and mx.metal.is_available()


# The one (bits, group_size) each non-affine mode allows; affine keeps float scales.
_UINT8_SCALE_MODES = {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}


def infer_quant_config(path, module, weights):
    """``{"group_size", "bits", "mode"}`` of the packed weight ``weights[path + ".weight"]``
    from its shape, its scales' shape and dtype and the unquantized ``module``'s input
    width; ValueError when no mode fits."""
    scales = weights[f"{path}.scales"]
    in_dims = module.weight.shape[-1]
    group_size = in_dims // scales.shape[-1]
    bits = weights[f"{path}.weight"].shape[-1] * 32 // in_dims
    if scales.dtype != mx.uint8:
        return {"group_size": group_size, "bits": bits, "mode": "affine"}
    mode = _UINT8_SCALE_MODES.get((bits, group_size))
    if mode is None:
        raise ValueError(f"Cannot infer the quantization mode of {path}: uint8 scales with "
                         f"bits={bits}, group_size={group_size}")
    return {"group_size": group_size, "bits": bits, "mode": mode}


def upload_to_hub(path, upload_repo, *args, **kwargs):
    """Refused: this package does not upload (``mlx_lm.upload`` or ``hf upload`` do)."""
    raise NotImplementedError(
        "mlx_lm_batched does not upload to the Hugging Face Hub: use `hf upload "
        f"{upload_repo} {path}` or mlx_lm.utils.upload_to_hub")


def create_model_card(path, hf_path, *args, **kwargs):
    """Refused with ``upload_to_hub``: model cards are written for uploads."""
    raise NotImplementedError(
        "mlx_lm_batched does not write Hub model cards: use mlx_lm.utils.create_model_card")
