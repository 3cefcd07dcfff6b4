"""mlx-lm's module paths kept importable here, and where their names live: one table.

Code written for mlx-lm imports ``mlx_lm.utils``, ``mlx_lm.models.cache``,
``mlx_lm.sample_utils`` ...; with ``mlx_lm_batched`` in the import they resolve to the
modules this table describes. None of them holds code: each is its names, taken from the
modules of this package that define them (``compat/reexport.py`` fills one in).

- :data:`MODULES`: mlx-lm path under ``mlx_lm_batched`` -> ``{module of this package:
  names}``. ``"alias=name"`` binds ``name`` under mlx-lm's ``alias``.
- :data:`COMMAND_MODULES`: the paths of :data:`MODULES` that ``python -m`` also runs
  (``generate``, ``chat`` ...): files of their own at the package's top, which call into
  ``cli/`` and fill their names from here (runpy runs a file).
- :data:`PACKAGES`: mlx-lm's packages whose modules are all rows of :data:`MODULES`
  (``chat_templates``); importing one gives an empty package.
- :data:`REFUSED`: mlx-lm's modules this package does not have -> the one line that
  says what to use instead (importing one raises ImportError with it; ``python -m``
  prints it and exits 1).
- :func:`model_alias_sources`: ``models.<model_type>`` for every registered model_type
  that another family's module serves (``models.MODEL_TYPES``), hyphenated names such as
  ``models.lfm2-vl`` included: ``Model`` and ``ModelArgs`` of that module.

Every path but the command modules is served by ``compat/finder.py``'s import hook.
"""

MODULES = {
    "generate": {
        "api.batch": ("batch_generate", "stream_batch_generate"),
        "api.device": ("generation_stream", "maybe_set_recommended_wired_limit", "wired_limit"),
        "api.generate": ("generate", "generate_step", "stream_generate"),
        "api.responses": ("BatchResponse", "BatchStreamResponse", "GenerationResponse"),
        "api.speculative": ("speculative_generate_step",),
        "cache.factory": ("make_prompt_cache",),
        "cache.files": ("load_prompt_cache",),
        "cache.prompt_cache": ("can_trim_prompt_cache", "trim_prompt_cache"),
        "cache.quantized": ("QuantizedKVCache", "maybe_quantize_kv_cache"),
        "cli.args": (
            "DEFAULT_MAX_TOKENS", "DEFAULT_MIN_P", "DEFAULT_MIN_TOKENS_TO_KEEP", "DEFAULT_MODEL",
            "DEFAULT_PREFILL_STEP_SIZE", "DEFAULT_PROMPT", "DEFAULT_QUANTIZED_KV_START",
            "DEFAULT_SEED", "DEFAULT_TEMP", "DEFAULT_TOP_K", "DEFAULT_TOP_P",
            "DEFAULT_XTC_PROBABILITY", "DEFAULT_XTC_THRESHOLD", "str2bool",
            "setup_arg_parser=build_parser"
        ),
        "cli.generate": ("main",),
        "loading.load": ("load",),
        "sampling.samplers": ("greedy_sampler", "make_sampler"),
        "sampling.stop_sequences": (
            "StopSequenceMatcher", "StopSequences", "make_stop_matcher", "make_stop_sequences"
        ),
        "sched.generator": ("BatchGenerator",),
        "sched.stats": ("BatchStats",),
        "tool_parsers.state_machine": ("TextStateMachine", "make_text_state_machine"),
    },
    "utils": {
        "api.device": ("maybe_set_recommended_wired_limit",),
        "compat.sizes": ("_parse_size=parse_size",),
        "loading.adapters": ("load_adapters",),
        "loading.dequantize": ("cast_floats", "dequantize_model"),
        "loading.load": (
            "ModelLoadError", "_get_classes=get_model_classes", "get_model_classes",
            "get_model_path", "hf_repo_to_path", "load", "load_config", "load_model",
            "load_weights", "model_from_weights"
        ),
        "loading.quant_formats": (
            "_compressed_tensors_quantization=compressed_tensors_quantization",
        ),
        "loading.model_info": (
            "can_run_metal", "compute_bits_per_weight", "create_model_card",
            "does_model_support_input_embeddings", "infer_quant_config", "upload_to_hub"
        ),
        "loading.save": (
            "common_prefix_len", "get_total_parameters", "load_tokenizer", "make_shards",
            "quantize_model", "save", "save_config", "save_model"
        ),
        "parallel.load": ("sharded_load",),
        "parallel.pipeline_load": ("pipeline_load",),
        "tokenization.tokenizer": ("TokenizerWrapper",),
    },
    "sample_utils": {
        "sampling.logits_processors": (
            "LogitsProcessor", "make_frequency_penalty", "make_logits_processors",
            "make_presence_penalty", "make_repetition_penalty"
        ),
        "sampling.samplers": (
            "BatchSampler", "Sampler", "apply_min_p", "apply_top_k", "apply_top_p", "apply_xtc",
            "categorical_sampling", "greedy_sampler", "make_sampler", "make_seeded_sampler"
        ),
    },
    "tokenizer_utils": {
        "loading.save": ("load_tokenizer", "load=load_tokenizer"),
        "tokenization.detokenizers": (
            "BPEStreamingDetokenizer", "NaiveStreamingDetokenizer", "SPMStreamingDetokenizer",
            "StreamingDetokenizer"
        ),
        "tokenization.newline": ("NewlineTokenizer",),
        "tokenization.sequences": ("no_bos_or_eos",),
        "tokenization.tokenizer": ("TokenizerWrapper", "encode_prompt"),
    },
    "convert": {
        "cli.convert": ("main",),
        "cli.convert_args": ("configure_parser",),
        "loading.convert": ("convert",),
        "loading.dequantize": ("dequantize_model",),
        "loading.load": ("load",),
        "loading.model_info": ("upload_to_hub",),
        "loading.quant_recipes": ("QUANT_RECIPES", "mixed_quant_predicate_builder"),
        "loading.save": ("quantize_model", "save"),
    },
    "gguf": {
        "loading.gguf": ("gguf_architecture", "read_gguf"),
        "loading.gguf_names": (
            "GGMLFileType", "TokenType", "permute_weights", "translate_weight_names"
        ),
        "loading.gguf_vocab": ("HfVocab", "prepare_metadata"),
        "loading.gguf_write": ("convert_to_gguf",),
    },
    "chat": {
        "api.generate": ("stream_generate",),
        "cli.args": (
            "DEFAULT_MAX_TOKENS", "DEFAULT_PREFILL_STEP_SIZE", "DEFAULT_TEMP", "DEFAULT_TOP_P",
            "DEFAULT_XTC_PROBABILITY"
        ),
        "cache.factory": ("make_prompt_cache",),
        "cli.chat": ("setup_arg_parser=build_parser", "main"),
        "loading.load": ("load",),
        "parallel.load": ("sharded_load",),
        "sampling.samplers": ("make_sampler",),
    },
    "cache_prompt": {
        "api.generate": ("generate_step",),
        "cache.factory": ("make_prompt_cache",),
        "cache.files": ("save_prompt_cache",),
        "cli.cache_prompt": ("setup_arg_parser=build_parser", "main"),
        "loading.load": ("load",),
    },
    "benchmark": {
        "api.batch": ("batch_generate",),
        "api.generate": ("stream_generate",),
        "cli.benchmark": ("setup_arg_parser=build_parser", "main"),
        "loading.load": ("load",),
        "parallel.load": ("sharded_load",),
    },
    "run_batch": {
        "cli.run_batch": ("build_parser", "main"),
    },
    "fuse": {
        "cli.fuse": ("parse_arguments=build_parser", "main"),
        "loading.dequantize": ("dequantize_model",),
        "loading.gguf_write": ("convert_to_gguf",),
        "loading.load": ("load",),
        "loading.model_info": ("upload_to_hub",),
        "loading.save": ("save",),
    },
    "perplexity": {
        "api.perplexity": ("eval_ppl", "load_data"),
        "cli.perplexity": ("build_parser", "main"),
        "loading.load": ("load",),
        "loading.save": ("get_total_parameters",),
    },
    "generate_utils": {
        "sched.stats": ("BatchCounters", "BatchCountersSnapshot", "BatchStats"),
    },
    "demo_models": {
        "loading.demo_models": ("gemma3_gguf_path", "smollm2_gguf_path"),
    },
    "models.cache": {
        "cache.batch_kv": ("BatchKVCache",),
        "cache.cache_list": ("CacheList",),
        "cache.chunked": ("ChunkedKVCache",),
        "cache.factory": ("make_prompt_cache",),
        "cache.files": ("load_prompt_cache", "save_prompt_cache"),
        "cache.kv": ("KVCache",),
        "cache.mlx_lm_lru": ("LRUPromptCache=MlxLmLRUPromptCache",),
        "cache.prompt_cache": (
            "PromptCache", "as_prompt_cache", "can_trim_prompt_cache", "trim_prompt_cache"
        ),
        "cache.prompt_trie": ("PromptTrie", "PromptTrieResult"),
        "cache.quantized": ("QuantizedKVCache",),
        "cache.rotating": ("RotatingKVCache",),
        "cache.state": ("StateCache", "ArraysCache=StateCache"),
        "cache.views": ("RowsView", "ShiftedView"),
        "compat.models_base": ("create_attention_mask", "create_causal_mask"),
        "compat.models_cache": (
            "BatchRotatingKVCache", "ConcatenateKVCache", "TokenBuffer", "dynamic_roll"
        ),
    },
    "models.base": {
        "compat.models_base": (
            "create_attention_mask", "create_causal_mask",
            "quantized_scaled_dot_product_attention", "scaled_dot_product_attention"
        ),
        "compat.models_ssm": ("create_ssm_mask",),
        "layers.collectives": ("gather_last_axis",),
        "models.args": ("BaseModelArgs",),
    },
    "models.activations": {
        "compat.models_activations": (
            "SwigluOAI", "XieLU", "precise_swiglu", "swiglu_oai", "xielu"
        ),
        "layers.mlp": ("swiglu",),
    },
    "models.gated_delta": {
        "compat.models_gated_delta": (
            "compute_g", "compute_lower_bound_g", "gated_delta_kernel",
            "gated_delta_kernel_unpacked", "gated_delta_kernel_xtree", "gated_delta_ops",
            "gated_delta_update", "normalize_qk"
        ),
        "layers.gated_delta": (
            "GatedDeltaNet", "KimiDeltaAttention", "gated_delta_rule", "l2_normalize"
        ),
    },
    "models.ssm": {
        "compat.models_ssm": (
            "compute_dt", "make_ssm_kernel", "segsum", "ssm_attn", "ssm_update",
            "ssm_update_kernel"
        ),
        "layers.ssm": (
            "CausalConv1d", "GatedRMSNorm", "HybridBlock", "NormedResidualBlock", "ShortConv",
            "base_cache", "causal_conv", "column_validity", "rg_lru_scan", "selective_scan",
            "ssd_scan", "weightless_rms_norm"
        ),
    },
    "models.switch_layers": {
        "compat.models_activations": ("SwiGLU",),
        "layers.mlp": ("swiglu",),
        "layers.moe": ("QuantizedSwitchLinear", "SwitchGLU", "SwitchLinear", "SwitchMLP"),
    },
    "models.rope_utils": {
        "layers.rope_classes": (
            "DynamicNTKScalingRoPE", "Llama3RoPE", "ProportionalRoPE", "SuScaledRoPE", "YarnRoPE",
            "apply_yarn_mscale", "initialize_rope"
        ),
    },
    "models.pipeline": {
        "compat.models_pipeline": ("PipelineMixin",),
    },
    "chat_templates.muse_spark": {
        "compat.response_formats": ("RESPONSE_FORMAT=MUSE_SPARK_RESPONSE_FORMAT",),
    },
    "models.mla": {
        "layers.mla": (
            "LATENT_NORM_EPS", "LatentDims", "MultiHeadLatentAttention", "merge_absorbed_kv_b",
            "mla_softmax_scale"
        ),
        "layers.multi_linear": ("MultiLinear", "QuantizedMultiLinear"),
    },
}

# ``tool_parsers.<family>``: mlx-lm's parser modules, each ``parse_tool_call``,
# ``tool_call_start`` and ``tool_call_end`` (``compat/tool_call_families.py``).
TOOL_PARSER_MODULES = {
    "compat.tool_call_families": (
        "function_gemma", "gemma4", "glm47", "json_tools", "kimi_k2", "laguna", "longcat",
        "minimax_m2", "mistral", "pythonic", "qwen3_coder"
    ),
    "compat.tool_call_markup": ("kimi_k3", "minicpm5", "muse_spark"),
}
for _module, _families in TOOL_PARSER_MODULES.items():
    for _family in _families:
        _markers = (f"tool_call_start={_family}_tool_call_start",
                    f"tool_call_end={_family}_tool_call_end")
        _row = {"compat.tool_call_families": _markers}
        _row[_module] = _row.get(_module, ()) + (f"parse_tool_call={_family}_parse_tool_call",)
        MODULES[f"tool_parsers.{_family}"] = _row

# mlx-lm's packages that hold only rows of this table (their modules are rows).
PACKAGES = ("chat_templates",)

COMMAND_MODULES = ("benchmark", "cache_prompt", "chat", "convert", "fuse", "generate",
                   "perplexity", "run_batch")

REFUSED = {
    "lora": "mlx_lm_batched does not train adapters: use mlx_lm.lora; its adapters load "
            "here with --adapter-path (load(..., adapter_path=...))",
    "tuner": "mlx_lm_batched does not train adapters: use mlx_lm.tuner / mlx_lm.lora; its "
             "adapters load here with --adapter-path (load(..., adapter_path=...))",
    "manage": "mlx_lm_batched does not manage the Hugging Face cache: use `hf cache scan` / "
              "`hf cache delete`, or mlx_lm.manage",
    "share": "mlx_lm_batched does not copy models between hosts: use mlx_lm.share, or copy "
             "the model directory to each host (sharded_load reads it there)",
    "upload": "mlx_lm_batched does not upload to the Hugging Face Hub: use "
              "`hf upload <repo> <path>`, or mlx_lm.upload",
    "quant": "mlx_lm_batched has no AWQ, GPTQ, DWQ or dynamic quantization: use "
             "mlx_lm.quant.<method> (its output loads here), or convert -q for affine "
             "quantization",
}


def model_alias_sources(path):
    """``{module: names}`` for ``models.<model_type>`` when a registered model_type is
    served by another family's module, else None."""
    prefix, _, model_type = path.partition(".")
    if prefix != "models" or not model_type or "." in model_type:
        return None
    from ..models import MODEL_TYPES

    family = MODEL_TYPES.get(model_type)
    if family is None or family == model_type:
        return None
    return {f"models.{family}": ("Model", "ModelArgs")}


def sources(path):
    """``{module: names}`` of the mlx-lm path ``path`` (relative to the package), or None
    when it is not one of this table's."""
    if path in PACKAGES:
        return {}
    return MODULES.get(path) or model_alias_sources(path)
