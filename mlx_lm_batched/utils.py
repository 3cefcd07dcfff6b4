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
from .loading.model_info import (
    can_run_metal,
    compute_bits_per_weight,
    create_model_card,
    does_model_support_input_embeddings,
    infer_quant_config,
    upload_to_hub,
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
from .parallel.pipeline_load import pipeline_load
from .tokenization.tokenizer import TokenizerWrapper

__all__ = ["ModelLoadError", "TokenizerWrapper", "can_run_metal", "cast_floats",
           "common_prefix_len", "compute_bits_per_weight", "create_model_card",
           "dequantize_model", "does_model_support_input_embeddings", "get_model_classes",
           "get_model_path", "get_total_parameters", "hf_repo_to_path", "infer_quant_config",
           "load", "load_adapters", "load_config", "load_model", "load_tokenizer",
           "load_weights", "make_shards", "maybe_set_recommended_wired_limit",
           "model_from_weights", "pipeline_load", "quantize_model", "save", "save_config",
           "save_model", "sharded_load", "upload_to_hub"]
