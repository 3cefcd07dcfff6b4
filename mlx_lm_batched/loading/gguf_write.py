"""Writing a llama-architecture checkpoint as a GGUF file (mlx-lm's ``convert_to_gguf``).

The inverse of ``gguf.read_gguf`` for ``llama``: llama.cpp's tensor names, its q/k row
permutation, its hyperparameter keys, and the tokenizer as a byte-level BPE vocabulary
(``tokenizer.ggml.model = "gpt2"`` with merges and the pre-tokenizer's llama.cpp name), so
this package's GGUF loader and llama.cpp-format readers load the file back."""

import json
from pathlib import Path

import mlx.core as mx

from .gguf import _LAYER_NAMES, _TOP_NAMES

_TO_GGUF = {hf: g for g, hf in _LAYER_NAMES["llama"].items()}
_TOP_TO_GGUF = {hf: g for g, hf in _TOP_NAMES.items()}
# llama.cpp token types
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4


def _gguf_name(name):
    """llama.cpp's name of one HF parameter name (``model.layers.0.mlp.up_proj.weight``)."""
    base, _, suffix = name.rpartition(".")
    if base.startswith("model.layers."):
        index, _, module = base[len("model.layers."):].partition(".")
        if module in _TO_GGUF:
            return f"blk.{index}.{_TO_GGUF[module]}.{suffix}"
    if base in _TOP_TO_GGUF:
        return f"{_TOP_TO_GGUF[base]}.{suffix}"
    raise ValueError(f"convert_to_gguf: no llama.cpp name for the llama parameter {name!r}")


def _permute(w, n_head):
    """llama.cpp's q/k row order (interleaved rotation pairs); ``gguf._unpermute`` inverts it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _pre_tokenizer_name(pre):
    """llama.cpp's ``tokenizer.ggml.pre`` for a tokenizer.json byte-level pre-tokenizer."""
    if pre is None or pre.get("type") == "ByteLevel":
        return "gpt2"
    kinds = [p.get("type") for p in pre.get("pretokenizers", [])]
    digits = [p for p in pre.get("pretokenizers", []) if p.get("type") == "Digits"]
    if kinds == ["Digits", "ByteLevel"] and digits[0].get("individual_digits"):
        return "smollm"  # every digit alone, then GPT-2's pattern
    if kinds == ["Split", "ByteLevel"]:
        pattern = pre["pretokenizers"][0].get("pattern", {}).get("Regex", "")
        if r"\p{N}{1,3}" in pattern:
            return "llama-bpe"
        if r"\p{N}" in pattern:
            return "qwen2"
    raise NotImplementedError(f"convert_to_gguf: tokenizer.json pre-tokenizer {kinds or pre} "
                              "has no llama.cpp name known here")


def _tokenizer_metadata(model_path, config):
    """``tokenizer.ggml.*`` for a byte-level BPE ``tokenizer.json`` (GPT-2, SmolLM, Llama 3)."""
    path = Path(model_path) / "tokenizer.json"
    if not path.exists():
        raise ValueError(f"convert_to_gguf: no tokenizer.json in {model_path}")
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE" or tok.get("decoder", {}).get("type") != "ByteLevel":
        raise NotImplementedError("convert_to_gguf: only byte-level BPE tokenizers are "
                                  f"written (this one is {model.get('type')})")
    ids = dict(model["vocab"])
    special = set()
    for added in tok.get("added_tokens", []):
        ids[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["content"])
    tokens = [None] * (max(ids.values()) + 1)
    for text, i in ids.items():
        tokens[i] = text
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise ValueError(f"convert_to_gguf: tokenizer.json has no token for ids {missing[:5]}")
    types = [_CONTROL if t in special else _NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": _pre_tokenizer_name(tok.get("pre_tokenizer")),
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
          "tokenizer.ggml.merges": merges}
    for key, field in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = config.get(key)
        if isinstance(value, list):  # several EOS ids: llama.cpp keeps one
            value = value[0]
        if value is not None:
            md[f"tokenizer.ggml.{field}_token_id"] = mx.array(value, dtype=mx.uint32)
    # transformers 5 saves the chat template beside the config, 4 inside it
    template_path = Path(model_path) / "chat_template.jinja"
    config_path = Path(model_path) / "tokenizer_config.json"
    template = template_path.read_text(encoding="utf-8") if template_path.exists() else None
    if template is None and config_path.exists():
        template = json.loads(config_path.read_text(encoding="utf-8")).get("chat_template")
    if template:
        md["tokenizer.chat_template"] = template
    return md


def _u32(value):
    return mx.array(value, dtype=mx.uint32)


def _f32(value):
    return mx.array(value, dtype=mx.float32)


def _model_metadata(config):
    """``general.*`` and ``llama.*`` keys from a transformers llama config."""
    if config.get("model_type") != "llama":
        raise NotImplementedError(f"convert_to_gguf: model_type {config.get('model_type')!r} "
                                  "is not written (only llama)")
    for key in ("rope_scaling", "quantization"):
        if config.get(key):
            raise NotImplementedError(f"convert_to_gguf: a config with {key} is not written")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise NotImplementedError("convert_to_gguf: llama biases are not written")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if head_dim * heads != config["hidden_size"]:
        raise NotImplementedError("convert_to_gguf: head_dim x heads other than hidden_size")
    return {
        "general.architecture": "llama", "general.alignment": _u32(32),
        "general.name": str(config.get("_name_or_path", "llama")).rstrip("/").split("/")[-1],
        "llama.context_length": _u32(config.get("max_position_embeddings", 2048)),
        "llama.embedding_length": _u32(config["hidden_size"]),
        "llama.block_count": _u32(config["num_hidden_layers"]),
        "llama.feed_forward_length": _u32(config["intermediate_size"]),
        "llama.rope.dimension_count": _u32(head_dim),
        "llama.attention.head_count": _u32(heads),
        "llama.attention.head_count_kv": _u32(config.get("num_key_value_heads") or heads),
        "llama.attention.layer_norm_rms_epsilon": _f32(config.get("rms_norm_eps", 1e-6)),
        "llama.rope.freq_base": _f32(config.get("rope_theta", 10000.0)),
        "llama.vocab_size": _u32(config["vocab_size"]),
    }


def convert_to_gguf(model_path, weights, config, output_file_path):
    """mlx-lm's ``convert_to_gguf``: write ``weights`` (HF names, as in the checkpoint's
    safetensors) with ``config`` (its config.json dict) and ``model_path``'s tokenizer.json
    as the GGUF file ``output_file_path``. Llama architecture, float weights (bfloat16 is
    written as float16, norms as float32) and a byte-level BPE tokenizer; anything else
    raises one NotImplementedError line."""
    metadata = _model_metadata(config)
    metadata.update(_tokenizer_metadata(model_path, config))
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    out = {}
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")) or w.dtype == mx.uint32:
            raise NotImplementedError("convert_to_gguf: quantized weights are not written")
        if "rotary_emb" in name:
            continue
        if ".self_attn.q_proj." in name:
            w = _permute(w, heads)
        elif ".self_attn.k_proj." in name:
            w = _permute(w, kv_heads)
        gname = _gguf_name(name)
        if gname.endswith("norm.weight"):
            w = w.astype(mx.float32)
        elif w.dtype == mx.bfloat16:
            w = w.astype(mx.float16)
        out[gname] = w
    mx.save_gguf(str(output_file_path), out, metadata)
