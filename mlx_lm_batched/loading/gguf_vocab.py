"""mlx-lm's GGUF-writer vocabulary and metadata (``mlx_lm.gguf.HfVocab`` and
``prepare_metadata``, after llama.cpp's convert.py): a Hugging Face tokenizer listed as
llama.cpp ``(text, score, type)`` entries, and the ``general.*``, ``llama.*`` and
``tokenizer.ggml.*`` keys mlx-lm writes for a llama checkpoint with that vocabulary.

This package's own ``convert_to_gguf`` writes a byte-level BPE vocabulary with its merges
instead (``gguf_write.py``); these are here for code that builds mlx-lm's metadata."""

import re
from pathlib import Path

import mlx.core as mx
from ..tokenization.hf_classes import AutoTokenizer

from .gguf_names import GGMLFileType, TokenType

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_SCORE = -1000.0  # every token's score: a Hugging Face vocabulary carries none


class HfVocab:
    """The tokenizer at ``fname_tokenizer`` (offline) as llama.cpp's vocabulary: the base
    vocabulary in id order, then the added tokens past it."""

    def __init__(self, fname_tokenizer, fname_added_tokens=None):
        self.tokenizer = AutoTokenizer.from_pretrained(fname_tokenizer, cache_dir=fname_tokenizer,
                                                       local_files_only=True)
        base = self.tokenizer.vocab_size
        beyond = sorted((i, t) for t, i in self.tokenizer.get_added_vocab().items() if i >= base)
        self.added_tokens_list = [t for _, t in beyond]
        self.added_tokens_dict = {t: i for i, t in beyond}
        self.added_tokens_ids = {i for i, _ in beyond}
        vocab = self.tokenizer.get_vocab()
        self.specials = {t: vocab[t] for t in self.tokenizer.all_special_tokens}
        self.special_ids = set(self.tokenizer.all_special_ids)
        self.vocab_size_base = base
        self.vocab_size = base + len(self.added_tokens_list)
        self.fname_tokenizer = fname_tokenizer
        self.fname_added_tokens = fname_added_tokens

    def get_token_type(self, token_id, token_text, special_ids):
        """BYTE for ``<0xNN>`` tokens, CONTROL for special ids, else NORMAL."""
        if _BYTE_TOKEN.fullmatch(token_text):
            return TokenType.BYTE
        return TokenType.CONTROL if token_id in special_ids else TokenType.NORMAL

    def get_token_score(self, token_id):
        return _SCORE

    def hf_tokens(self):
        """``(text, score, type)`` of each base-vocabulary id, added tokens skipped."""
        by_id = {i: t for t, i in self.tokenizer.get_vocab().items()}
        for i in range(self.vocab_size_base):
            if i not in self.added_tokens_ids:
                text = by_id[i]
                yield text, self.get_token_score(i), self.get_token_type(i, text, self.special_ids)

    def added_tokens(self):
        """``(text, score, type)`` of each added token past the base vocabulary."""
        for text in self.added_tokens_list:
            if text in self.specials:
                i = self.specials[text]
                yield text, self.get_token_score(i), self.get_token_type(i, "", self.special_ids)
            else:
                yield text, _SCORE, TokenType.USER_DEFINED

    def all_tokens(self):
        yield from self.hf_tokens()
        yield from self.added_tokens()

    def has_newline_token(self):
        return "<0x0A>" in self.tokenizer.vocab or "\n" in self.tokenizer.vocab

    def __repr__(self):
        return (f"<HfVocab with {self.vocab_size_base} base tokens and "
                f"{len(self.added_tokens_list)} added tokens>")

    @staticmethod
    def load(path):
        """The vocabulary at ``path``, with ``added_tokens.json`` beside it when present."""
        added = Path(path).parent / "added_tokens.json"
        return HfVocab(path, added if added.exists() else None)


# llama.cpp key, config key, MLX dtype (None: MLX's default for the Python value).
_HYPER = [
    ("llama.context_length", "max_position_embeddings", mx.uint32),
    ("llama.embedding_length", "hidden_size", mx.uint32),
    ("llama.block_count", "num_hidden_layers", mx.uint32),
    ("llama.feed_forward_length", "intermediate_size", mx.uint32),
    ("llama.attention.head_count", "num_attention_heads", mx.uint32),
    ("llama.expert_count", "num_local_experts", mx.uint32),
    ("llama.expert_used_count", "num_experts_per_tok", mx.uint32),
    ("llama.attention.layer_norm_rms_epsilon", "rms_norm_eps", None),
    ("llama.rope.freq_base", "rope_theta", mx.float32),
]


def prepare_metadata(config, vocab):
    """mlx-lm's GGUF metadata for a llama ``config`` and an :class:`HfVocab`: the
    hyperparameters the config has (missing ones left out), a linear RoPE scaling, the
    float16 file type, and the vocabulary with llama.cpp's token types."""
    md = {}
    for key, name, dtype in _HYPER:
        if config.get(name) is not None:
            md[key] = mx.array(config[name], dtype=dtype) if dtype else mx.array(config[name])
    heads = config.get("num_attention_heads")
    if heads is not None:
        if config.get("hidden_size") is not None:
            md["llama.rope.dimension_count"] = mx.array(config["hidden_size"] // heads, mx.uint32)
        md["llama.attention.head_count_kv"] = mx.array(config.get("num_key_value_heads", heads),
                                                       mx.uint32)
    scaling = config.get("rope_scaling")
    if scaling is not None and scaling.get("type") == "linear":
        md["llama.rope.scaling.type"] = "linear"
        md["llama.rope.scaling.factor"] = mx.array(scaling.get("factor"))
    f16 = GGMLFileType.GGML_TYPE_F16.value
    md["general.file_type"] = mx.array(f16, dtype=mx.uint32)
    md["general.quantization_version"] = mx.array(f16, dtype=mx.uint32)
    md["general.name"] = config.get("_name_or_path", "llama").split("/")[-1]
    md["general.architecture"] = "llama"
    md["general.alignment"] = mx.array(32, dtype=mx.uint32)
    md["tokenizer.ggml.model"] = "llama"
    entries = list(vocab.all_tokens())
    if len(entries) != vocab.vocab_size:
        raise ValueError(f"the vocabulary lists {len(entries)} tokens, not {vocab.vocab_size}")
    md["tokenizer.ggml.tokens"] = [text for text, _, _ in entries]
    md["tokenizer.ggml.scores"] = mx.array([score for _, score, _ in entries], dtype=mx.float32)
    md["tokenizer.ggml.token_type"] = mx.array([kind.value for _, _, kind in entries],
                                               dtype=mx.uint32)
    tok = vocab.tokenizer
    for field, value in (("bos", tok.bos_token_id), ("eos", tok.eos_token_id),
                         ("unknown", tok.unk_token_id)):
        if value is not None:
            md[f"tokenizer.ggml.{field}_token_id"] = mx.array(value, dtype=mx.uint32)
    return md
