"""Loading models and tokenizers: local directories, Hugging Face repos, GGUF files."""

import glob
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..models import get_model_module, resolve_model_type
from .adapters import load_adapters
from .config_checks import check_config_fields
from .dequantize import cast_floats, dequantize_dtype, dequantize_for_device, dequantize_model
from .mlx_lm_layout import from_mlx_lm_weights, module_quantization
from .model_files import (  # noqa: F401  (mlx-lm names, also imported from here)
    HUB_PATTERNS, ModelLoadError, generation_eos, get_model_path, hf_repo_to_path, load_config,
    one_line)
from .quant_formats import compressed_tensors_quantization
from .remote_code import model_file_classes

def quantization_config(config):
    """The MLX quantization settings in ``config`` (mlx-lm layout), or None."""
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, dict) and "bits" in q and "group_size" in q:
        return q
    if isinstance(q, dict) and q.get("quant_method") == "mxfp4":
        # Hugging Face MXFP4 checkpoints (GPT-OSS experts as blocks + scales, which
        # the architecture's sanitize maps to MLX's mxfp4 layout).
        return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    if isinstance(q, dict) and q.get("quant_method") == "compressed-tensors":
        return compressed_tensors_quantization(q)
    return None


def quantize_like(model, weights, qconfig):
    """Quantize exactly the modules whose quantized weights are in ``weights``.

    Per-module entries of ``qconfig`` (keyed by module path, mlx-lm style) override
    the global bits/group size; ``False`` keeps a module in float.
    """

    def predicate(path, module):
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        override = qconfig.get(path)
        if override is False:
            return False
        if isinstance(override, dict):
            return {k: v for k, v in override.items() if k in ("group_size", "bits", "mode")}
        return True

    nn.quantize(
        model,
        group_size=qconfig["group_size"],
        bits=qconfig["bits"],
        mode=qconfig.get("mode", "affine"),
        class_predicate=predicate,
    )


def get_model_classes(config):
    """mlx-lm's ``_get_classes``: ``(Model, ModelArgs)`` of ``config['model_type']``."""
    module = architecture_module(config)
    return module.Model, module.ModelArgs


def architecture_module(config, source="config.json"):
    """The module implementing ``config['model_type']`` (or the architecture it names,
    ``models.resolve_model_type``); a clear error when unknown."""
    model_type = config.get("model_type")
    if model_type is None:
        raise ModelLoadError(f"{source} has no 'model_type'")
    if not isinstance(model_type, str):
        raise ModelLoadError(f"{source}: 'model_type' must be a string, got {model_type!r:.60}")
    try:
        return get_model_module(resolve_model_type(config))
    except ValueError as e:
        raise ModelLoadError(f"{source}: {e}") from None


def _check_weights(model, weights, source):
    """Strict name and shape check with one-line errors (MLX's list one name per line)."""
    from mlx.utils import tree_flatten

    expected = dict(tree_flatten(model.parameters()))

    def names(keys):
        keys = sorted(keys)
        more = f" (and {len(keys) - 8} more)" if len(keys) > 8 else ""
        return ", ".join(keys[:8]) + more

    if missing := expected.keys() - weights.keys():
        raise ModelLoadError(f"{source}: missing {len(missing)} parameters: {names(missing)}")
    if extra := weights.keys() - expected.keys():
        raise ModelLoadError(
            f"{source}: {len(extra)} parameters not in the model: {names(extra)}")
    for k, v in expected.items():
        if not isinstance(weights[k], mx.array) or weights[k].shape != v.shape:
            got = getattr(weights[k], "shape", type(weights[k]).__name__)
            raise ModelLoadError(f"{source}: parameter {k} has shape {tuple(got)}, "
                                 f"the model expects {tuple(v.shape)}")


def _check_config(module, config, source):
    text = config.get("text_config")
    if isinstance(text, dict):  # multimodal checkpoints: the language model's settings
        config = {**config, **text, "model_type": config.get("model_type")}
    try:
        check_config_fields(module.ModelArgs, config, source)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None


def model_from_weights(config, weights, strict=True, lazy=False, source="config.json",
                       weights_source=None, model_classes=None):
    """Build the architecture ``config`` names (or ``model_classes(config) -> (Model,
    ModelArgs)``) and load ``weights`` (HF names) into it.

    ``source`` names where the config came from in error messages, ``weights_source``
    (default: ``source``) where the weights came from. Raises
    ``ModelLoadError`` (a ``ValueError``) for a config the architecture cannot use
    (missing key, wrongly typed value) and for missing, extra or misshapen weights.
    """
    if model_classes is None:  # the registry's architecture: its config checks first
        _check_config(architecture_module(config, source), config, source)
    try:
        model_class, args_class = (model_classes or get_model_classes)(config)
        model = model_class(args_class.from_dict(config))
    except (ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError) as e:
        # A config the checks let through but the architecture cannot build.
        raise ModelLoadError(f"{source}: not a valid '{config['model_type']}' config: "
                             f"{type(e).__name__}: {one_line(e)}") from None
    try:
        if hasattr(model, "sanitize"):  # a custom architecture may have none (mlx-lm)
            weights = model.sanitize(weights)
        weights = from_mlx_lm_weights(config.get("model_type"), weights)
        qconfig = quantization_config(config)
        if qconfig is not None:
            quantize_like(model, weights, module_quantization(config.get("model_type"), qconfig))
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise ModelLoadError(f"{weights_source or source}: weights do not fit the config: "
                             f"{type(e).__name__}: {one_line(e)}") from None
    if strict:
        _check_weights(model, weights, weights_source or source)
    model.load_weights(list(weights.items()), strict=False)
    if not lazy:
        mx.eval(model.parameters())
    model.eval()
    return model


def _has_weights(model_path):
    return bool(glob.glob(str(Path(model_path) / "*.safetensors")))


def load_weights(model_path):
    """All ``*.safetensors`` tensors of a directory in one dict."""
    files = sorted(glob.glob(str(Path(model_path) / "*.safetensors")))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in '{model_path}'")
    weights = {}
    for f in files:
        try:
            weights.update(mx.load(f))
        except (RuntimeError, ValueError, OSError) as e:  # truncated, corrupt, unreadable
            raise ModelLoadError(f"cannot read weights '{f}': {one_line(e)}") from None
    return weights


def load_model(model_path, lazy=False, strict=True, model_config=None,
               get_model_classes=None, trust_remote_code=False):
    """Load a model from a local directory; returns ``(model, config)``.

    ``strict=False`` loads weights that do not cover the model (or carry extras, or
    none: a directory without weights gives the initial parameters, as in mlx-lm);
    ``get_model_classes(config) -> (Model, ModelArgs)`` replaces the registry (mlx-lm's
    hook for custom architectures). A config naming a ``model_file`` (the checkpoint's
    own architecture in Python) loads only with ``trust_remote_code=True``, mlx-lm's
    opt-in (``remote_code.py``)."""
    config = load_config(model_path)
    config.update(_check_dict("model_config", model_config))
    source = str(Path(model_path) / "config.json")
    try:
        own_classes = model_file_classes(model_path, config, trust_remote_code)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    if own_classes is not None:
        get_model_classes = lambda _config: own_classes  # noqa: E731
    if get_model_classes is None:
        _check_config(architecture_module(config, source), config, source)  # before weights
    weights = load_weights(model_path) if strict or _has_weights(model_path) else {}
    model = model_from_weights(config, weights, strict=strict, lazy=lazy,
                               source=source, weights_source=str(Path(model_path) / "*.safetensors"),
                               model_classes=get_model_classes)
    return model, config


def _check_dict(name, value):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict or None, got {type(value).__name__}")
    return value


def _gguf_tokenizer_dir(gguf_path):
    """A cache directory for the tokenizer files extracted from a GGUF (keyed by the file
    and by the tokenizer builder's version, so files an older builder wrote are not reused)."""
    from .gguf_tokenizer import TOKENIZER_VERSION

    st = os.stat(gguf_path)
    key = hashlib.sha1(f"{os.path.abspath(gguf_path)}:{st.st_size}:{st.st_mtime_ns}:{TOKENIZER_VERSION}".encode())
    root = Path(os.environ.get("MLX_LM_BATCHED_CACHE", Path.home() / ".cache" / "mlx_lm_batched"))
    return root / "gguf_tokenizers" / key.hexdigest()[:16]


def load_gguf(path, dtype=None, tokenizer_config=None, model_config=None):
    """Load a GGUF file: ``(model, tokenizer, config)``.

    Q4_0/Q4_1/Q8_0 tensors stay quantized unless ``dtype`` asks for floats.
    """
    from .gguf import read_gguf
    from .gguf_tokenizer import save_gguf_tokenizer

    weights, config, _ = read_gguf(path, dtype=dtype)
    config.update(_check_dict("model_config", model_config))
    model = model_from_weights(config, weights, source=str(path))
    tok_dir = _gguf_tokenizer_dir(path)
    if not (tok_dir / "tokenizer_config.json").exists():
        # Built beside the cache entry and renamed into place, so an interrupted build never
        # leaves a half-written directory that later loads would trust.
        tok_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f"{tok_dir.name}.", dir=tok_dir.parent)
        try:
            save_gguf_tokenizer(path, tmp)
            os.replace(tmp, tok_dir)
        except OSError:
            if not (tok_dir / "tokenizer_config.json").exists():
                raise
        finally:  # a concurrent load that renamed its copy first leaves ours behind
            shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = _load_tokenizer(tok_dir, tokenizer_config, config.get("eos_token_id"))
    return model, tokenizer, config


def load(
    path_or_hf_repo,
    tokenizer_config=None,
    model_config=None,
    adapter_path=None,
    lazy=False,
    return_config=False,
    revision=None,
    trust_remote_code=False,
    dtype=None,
    dequantize=False,
):
    """Load a model and its tokenizer (mlx-lm's ``load``).

    ``path_or_hf_repo`` is a local model directory, a ``.gguf`` file, or a Hugging
    Face repo id (downloaded through huggingface-hub unless ``HF_HUB_OFFLINE`` is
    set). ``dtype`` (e.g. ``mx.float32``) casts float weights after loading and,
    for GGUF files, dequantizes everything. Returns ``(model, tokenizer)``, plus
    the config when ``return_config`` is True.

    ``dequantize=True`` turns a quantized model's layers into float ones after
    loading (see :func:`dequantize_model`): on CPUs, where MLX's quantized matmul
    is far slower than float GEMM, this trades memory (about 6x the 4-bit size
    in float32) for speed, with the same outputs up to float rounding. When the
    default device is the CPU the whole model becomes float32 (MLX's CPU
    float16/bfloat16 matmuls skip the BLAS and are slower than float32); on a
    GPU the floats keep the checkpoint's dtype. An explicit ``dtype`` wins.

    ``trust_remote_code=True`` lets a checkpoint whose config names a ``model_file``
    run that file to build its architecture (mlx-lm's opt-in, off by default; the
    tokenizer never runs repository code here). Stop tokens: ``generation_config.json``'s
    ``eos_token_id`` wins over ``config.json``'s (as in mlx-lm); ``model_config``
    overrides both.

    Raises ``ModelLoadError`` (a ``ValueError``; one line naming the file) for a
    missing path, a ``config.json`` that is not a JSON object, lacks
    ``model_type`` or a required key, or has a wrongly typed value, for truncated
    or corrupt ``.safetensors`` files, missing or misshapen weights and an
    unloadable tokenizer and a malformed adapter; ``TypeError`` for arguments of
    the wrong type.

    ``adapter_path``: a directory in mlx-lm's adapter format (``adapter_config.json`` +
    ``adapters.safetensors``: LoRA, DoRA or a full fine-tune, see ``loading.adapters``),
    applied to every row; ``dequantize``/``dtype`` apply to the base weights first.
    """
    if adapter_path is not None and not isinstance(adapter_path, (str, os.PathLike)):
        raise TypeError(f"adapter_path must be a directory path, got {type(adapter_path).__name__}")
    if not isinstance(path_or_hf_repo, (str, os.PathLike)):
        raise TypeError(f"path_or_hf_repo must be a path or a repo id string, "
                        f"got {type(path_or_hf_repo).__name__}")
    _check_dict("tokenizer_config", tokenizer_config)
    _check_dict("model_config", model_config)
    if str(path_or_hf_repo).endswith(".gguf"):
        if not os.path.isfile(path_or_hf_repo):
            raise ModelLoadError(f"GGUF file '{path_or_hf_repo}' does not exist")
        if dequantize and dtype is None and mx.default_device() == mx.cpu:
            # Reading the GGUF as float32 dequantizes in numpy with ggml's arithmetic,
            # faster than dequantizing MLX's quantized layers afterwards.
            dtype = mx.float32
        model, tokenizer, config = load_gguf(path_or_hf_repo, dtype, tokenizer_config, model_config)
        if dequantize:
            dequantize_model(model, dtype or dequantize_dtype())
    else:
        model_path = get_model_path(str(path_or_hf_repo), revision)
        if model_path.is_file():
            raise ModelLoadError(f"'{model_path}' is a file: pass a model directory or a .gguf file")
        model, config = load_model(model_path, lazy, model_config=model_config,
                                   trust_remote_code=trust_remote_code)
        if dequantize:
            dequantize_for_device(model, dtype)
        elif dtype is not None:
            cast_floats(model, dtype)
        eos = (model_config or {}).get("eos_token_id")
        if eos is None:
            eos = generation_eos(model_path)
            if eos is not None:
                config["eos_token_id"] = eos
        tokenizer = _load_tokenizer(model_path, tokenizer_config, config.get("eos_token_id"))
    if adapter_path is not None:
        load_adapters(model, adapter_path)
    return (model, tokenizer, config) if return_config else (model, tokenizer)


def _load_tokenizer(model_path, tokenizer_config, eos):
    """``load_tokenizer`` with its (often many-line) errors as one ModelLoadError line."""
    from ..tokenization.tokenizer import load_tokenizer
    from ..tool_parsers import tool_markup

    try:
        return load_tokenizer(model_path, tokenizer_config, eos_token_ids=eos,
                              tool_markup=tool_markup)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ModelLoadError(f"cannot load the tokenizer in '{model_path}': "
                             f"{type(e).__name__}: {one_line(e)}") from None
