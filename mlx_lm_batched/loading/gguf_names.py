"""mlx-lm's GGUF-writing helpers that code imports from ``mlx_lm.gguf``: llama.cpp's
token-type and file-type numbers, its tensor names for HF llama/mixtral parameter names,
and its q/k row permutation."""

import re
from enum import IntEnum

from .gguf_write import _permute


class TokenType(IntEnum):
    """llama.cpp's ``tokenizer.ggml.token_type`` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class GGMLFileType(IntEnum):
    """``general.file_type`` of a float16 GGUF (the only one mlx-lm writes)."""

    GGML_TYPE_F16 = 1


# Applied in order to the whole name: layers first, so the top-level renames below
# ("model.norm", "model.embed_tokens") only meet names outside the blocks.
_RENAMES = [
    (r"model\.layers\.", "blk."),
    (r"block_sparse_moe\.gate", "ffn_gate_inp"),
    (r"block_sparse_moe\.experts\.(\d+)\.w1\.weight", r"ffn_gate.\1.weight"),
    (r"block_sparse_moe\.experts\.(\d+)\.w2\.weight", r"ffn_down.\1.weight"),
    (r"block_sparse_moe\.experts\.(\d+)\.w3\.weight", r"ffn_up.\1.weight"),
    (r"mlp\.gate_proj", "ffn_gate"),
    (r"mlp\.down_proj", "ffn_down"),
    (r"mlp\.up_proj", "ffn_up"),
    (r"self_attn\.q_proj", "attn_q"),
    (r"self_attn\.k_proj", "attn_k"),
    (r"self_attn\.v_proj", "attn_v"),
    (r"self_attn\.o_proj", "attn_output"),
    (r"input_layernorm", "attn_norm"),
    (r"post_attention_layernorm", "ffn_norm"),
    (r"model\.embed_tokens", "token_embd"),
    (r"model\.norm", "output_norm"),
    (r"lm_head", "output"),
]


def translate_weight_names(name):
    """llama.cpp's tensor name for an HF llama (or mixtral) parameter name; names it
    has no rule for pass through with the rules that match applied."""
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def permute_weights(weights, n_head, n_head_kv=None):
    """llama.cpp's row order of a q (or, with ``n_head_kv``, k) projection: each head's
    two rotation halves interleaved."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return _permute(weights, n_head)
