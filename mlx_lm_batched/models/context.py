"""The model's limits, read from its config in one place: the context length (every
caller's cap, reservation and check uses :func:`context_length`) and the vocabulary."""

from typing import Optional

import mlx.core as mx


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def model_vocab_size(model) -> Optional[int]:
    """Rows of the model's token embedding (ids at or past it crash the lookup)."""
    inner = getattr(model, "model", None)
    emb = getattr(inner, "embed_tokens", None)
    weight = getattr(emb, "weight", None)
    if isinstance(weight, mx.array) and weight.ndim == 2:
        return int(weight.shape[0])
    vocab = getattr(getattr(model, "args", None), "vocab_size", None)
    return int(vocab) if _positive_int(vocab) else None


# Config fields that name the context, in the order families use them (GPT-2 and
# StarCoder: n_positions / n_ctx; some remote-code configs: max_seq_len, seq_length).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")


def context_length(model) -> Optional[int]:
    """The context the model was trained for, in tokens, or None when its config names
    none or its RoPE is dynamic NTK (which exists to run past ``max_position_embeddings``,
    so nothing caps it). Every cap on ``max_tokens``, cache reservation and server limit
    comes from here."""
    args = getattr(model, "args", model)
    scaling = getattr(args, "rope_scaling", None)
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "dynamic":
        return None
    for key in CONTEXT_KEYS:
        value = getattr(args, key, None)
        if _positive_int(value):
            return int(value)
    return None
