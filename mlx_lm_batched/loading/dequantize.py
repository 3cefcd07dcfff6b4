"""Float weights from quantized or half-precision ones: what ``--dequantize`` (the CLI,
the server) and ``convert`` use to run float32 on the CPU (whose half-float matmuls skip
the BLAS)."""

import mlx.core as mx
import mlx.nn as nn


def cast_floats(model, dtype, evaluate=True):
    """Cast the model's floating-point parameters to ``dtype`` in place (``evaluate``:
    now; False leaves the casts lazy, for weights a distributed load shards first)."""
    from mlx.utils import tree_map

    model.update(
        tree_map(lambda p: p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p,
                 model.parameters())
    )
    if evaluate:
        mx.eval(model.parameters())


def dequantize_dtype():
    """float32 when the default device is the CPU (its half-float matmuls skip the
    BLAS), else None: keep the checkpoint's dtype, whose GPU kernels are fast."""
    return mx.float32 if mx.default_device() == mx.cpu else None


def dequantize_for_device(model, dtype=None, evaluate=True):
    """``load(..., dequantize=True)``'s float model: quantized layers dequantized and
    every float cast to ``dtype`` (default :func:`dequantize_dtype`: float32 on the CPU;
    on a GPU the scales' dtype, nothing cast). ``evaluate``: as :func:`cast_floats`."""
    dtype = dtype or dequantize_dtype()
    dequantize_model(model, dtype)
    if dtype is not None:
        cast_floats(model, dtype, evaluate)


class DequantizeDoesNotFit(ValueError):
    """An asked ``--dequantize`` whose float32 weights cannot fit in the memory available."""


def is_quantized(model):
    """Whether any layer of ``model`` holds packed weights (Linear, Embedding, MoE)."""
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) or hasattr(m, "dequantized")
               for _, m in model.named_modules())


def weights_for_device(model, dequantize, available, shards=1, evaluate=True):
    """Put a loaded model's weights in the form the CLI and the server run, and describe it.

    ``dequantize``: True (``--dequantize``): a quantized model's weights become floats
    (float32 on the CPU, the scales' dtype on a GPU); False or None (the default, as
    ``load`` and mlx-lm keep them): as stored, packed weights and the checkpoint's float
    dtype, so the CLI, the server and the Python API compute the same thing. ``available``:
    bytes of memory free (None: unknown, no check); ``shards``: ranks the weights will be
    split over (a lazily loaded model). Returns the summary's words ("float",
    "dequantized", "quantized"); raises :class:`DequantizeDoesNotFit` (a ValueError, one
    line) for an asked dequantizing that cannot fit."""
    if not is_quantized(model):
        return "float"
    if not dequantize:
        return "quantized"
    if mx.default_device() == mx.cpu and available is not None:
        from mlx.utils import tree_flatten

        need = dequantized_bytes(model, mx.float32) // shards
        if shards == 1:  # dequantizing frees the packed weights, already held
            available += sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        if need > available:
            raise DequantizeDoesNotFit(f"--dequantize: the float32 weights need {need / 1e9:.1f} GB and "
                                       f"{available / 1e9:.1f} GB is available; run without it "
                                       f"(kept quantized)")
    # float32 on the CPU, whose float16 matmuls skip the BLAS (a GGUF's float16 scales
    # made the default model decode 5x slower).
    dequantize_for_device(model, evaluate=evaluate)
    return "dequantized"


def dequantized_bytes(model, dtype=mx.float32):
    """Bytes the model's parameters would take after :func:`dequantize_for_device` with
    ``dtype``: every packed weight unpacked to one ``dtype`` element per value, its scales
    and biases gone, every other floating-point parameter cast, integer buffers as they
    are. Reads shapes only, so a lazily loaded model stays unevaluated."""
    itemsize = mx.zeros((), dtype=dtype).itemsize
    elements = kept_bytes = 0
    for _, module in model.named_modules():
        # Quantized Linear, Embedding and MoE switch layers pack 32 // bits values into
        # each uint32 word of their weight, next to scales (and, affine, biases).
        quantized = getattr(module, "bits", None) is not None and "scales" in module
        for key, value in module.items():
            if not isinstance(value, mx.array):
                continue
            if quantized and key == "weight":
                elements += value.size * 32 // module.bits
            elif quantized and key in ("scales", "biases"):
                continue
            elif mx.issubdtype(value.dtype, mx.floating):
                elements += value.size
            else:
                kept_bytes += value.nbytes
    return elements * itemsize + kept_bytes


def dequantize_model(model, dtype=None):
    """Replace quantized layers (Linear, Embedding, MoE switch layers) by float ones.

    The float weights are exactly what the quantized ones encode, in ``dtype``
    (scales and biases are widened first, so float32 loses nothing) or, when
    None, in the dtype of the quantization scales. Works in place and returns
    the model.
    """
    from mlx.utils import tree_unflatten

    def weight(module):
        scales, biases = module.scales, module.get("biases")
        widen = dtype is not None and module.mode == "affine"  # other modes: packed scales
        if widen:
            scales = scales.astype(dtype)
            biases = None if biases is None else biases.astype(dtype)
        w = mx.dequantize(module.weight, scales, biases, module.group_size, module.bits,
                          mode=module.mode)
        return w if dtype is None or widen else w.astype(dtype)

    layers = []
    for name, module in model.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            w = weight(module)
            lin = nn.Linear(w.shape[1], w.shape[0], bias="bias" in module)
            lin.weight = w
            if "bias" in module:
                lin.bias = module.bias
            layers.append((name, lin))
        elif hasattr(module, "dequantized"):  # quantized MoE switch layers
            layer = module.dequantized()
            if dtype is not None:
                layer.weight = layer.weight.astype(dtype)
            layers.append((name, layer))
        elif isinstance(module, nn.QuantizedEmbedding):
            w = weight(module)
            emb = nn.Embedding(*w.shape)
            emb.weight = w
            layers.append((name, emb))
    if layers:
        model.update_modules(tree_unflatten(layers))
        mx.eval(model.parameters())
    return model
