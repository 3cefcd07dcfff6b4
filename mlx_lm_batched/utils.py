"""mlx-lm's ``mlx_lm.utils``: loading, saving and sharded loading under the names code
written for mlx-lm imports (``loading/``, ``parallel/``)."""

from .api.device import maybe_set_recommended_wired_limit
from .loading.adapters import load_adapters
from .loading.dequantize import cast_floats, dequantize_model
from .loading.load import (
    ModelLoadError,
    get_model_classes,
    get_model_path,
    hf_repo_to_path,
    load,
    load_config,
    load_model,
    load_weights,
    model_from_weights,
)
from .loading.save import (
    common_prefix_len,
    get_total_parameters,
    load_tokenizer,
    make_shards,
    quantize_model,
    save,
    save_config,
    save_model,
)
from .parallel.load import sharded_load

__all__ = ["ModelLoadError", "cast_floats", "common_prefix_len", "dequantize_model",
           "get_model_classes", "get_model_path", "get_total_parameters", "hf_repo_to_path",
           "load", "load_adapters", "load_config", "load_model", "load_tokenizer",
           "load_weights", "make_shards", "maybe_set_recommended_wired_limit",
           "model_from_weights", "quantize_model", "save",
           "save_config", "save_model", "sharded_load"]
