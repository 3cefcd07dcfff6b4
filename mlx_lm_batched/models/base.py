"""Model arguments and the per-call plumbing every architecture shares."""

import inspect
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx

from . import masks as masks_lib
from .prompt_cache import cache_offsets


@dataclass
class BaseModelArgs:
    """Dataclass built from a Hugging Face ``config.json`` dict (unknown keys ignored)."""

    @classmethod
    def from_dict(cls, params):
        params = normalize_rope_config(params)
        names = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in names})


def normalize_rope_config(config):
    """Read RoPE settings from both config layouts found in the wild.

    transformers 4 writes ``rope_theta`` / ``rope_scaling`` at the top level;
    transformers 5 writes ``rope_parameters`` (with ``rope_theta`` inside), or one
    such dict per layer type (``full_attention``, ``sliding_attention``). The result
    always has the flat keys; per-type settings are also kept as
    ``rope_parameters_by_type`` and the sliding one as ``rope_local_base_freq``.
    """
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        return config
    config = dict(config)
    by_type = None
    if params and all(isinstance(v, dict) for v in params.values()):
        by_type = params
        params = by_type.get("full_attention") or next(iter(by_type.values()))
        config["rope_parameters_by_type"] = by_type
        local = by_type.get("sliding_attention")
        if local and "rope_theta" in local:
            config.setdefault("rope_local_base_freq", local["rope_theta"])
    if "rope_theta" in params:
        config.setdefault("rope_theta", params["rope_theta"])
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in (None, "default") and not config.get("rope_scaling"):
        config["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    for key in ("partial_rotary_factor",):
        if key in params:
            config.setdefault(key, params[key])
    return config


@dataclass(frozen=True)
class StepAttention:
    """Per-step attention data the batch driver hands the model with ``offset`` and
    ``mask``; layers read it from their arguments, never from caches.

    ``row_groups``: for a decode step (one query per row), contiguous row groups
    ``(start, stop, first_slot)`` whose attention skips the key slots before
    ``first_slot``, padding for all their rows (None: one call over every slot).
    """

    row_groups: Optional[tuple] = None


def resolve_offset(inputs, offset, cache):
    """Per-row position of the first input column, as an ``(B,)`` int32 array.

    The batch driver always passes it. Callers that don't (mlx-lm style
    ``model(x, cache=cache)``) get the positions the batch's ``PromptCache`` records
    (a plain list of caches holds unpadded rows).
    """
    B = inputs.shape[0]
    if offset is None:
        return cache_offsets(cache, B)
    if not isinstance(offset, mx.array):
        offset = mx.array(offset, dtype=mx.int32)
    if offset.ndim == 0:
        offset = mx.broadcast_to(offset, (B,))
    return offset.astype(mx.int32)


def resolve_masks(mask, cache, windows, query_len, offset, chunks=None):
    """Per-layer masks: the caller's (one array, or a list per layer) or built here
    (``chunks``: per-layer attention chunk sizes, see ``masks.masks_for_layers``)."""
    if isinstance(mask, (list, tuple)):
        return list(mask)
    if isinstance(mask, mx.array):
        return [mask] * len(windows)
    return masks_lib.masks_for_layers(cache, windows, query_len, offset, chunks)


# mlx-lm's names (models.base) for code that builds its own attention: thin views over
# the one mask path (masks.py) and the shared attention op (layers.py).
def create_causal_mask(N, offset=0, window_size=None, right_padding=None, left_padding=None):
    """Boolean causal mask of ``N`` queries after ``offset`` cached tokens (mlx-lm's).

    ``(N, offset + N)``, or ``(B, 1, N, offset + N)`` with ``left_padding`` (``(B,)``
    padding slots per row). A padding query may attend its own slot (so it never gets
    NaN; see masks.py). ``right_padding`` raises ``NotImplementedError``: batches here
    are left-padded.
    """
    if right_padding is not None:
        raise NotImplementedError("right_padding is not supported: mlx_lm_batched batches are "
                                  "left-padded (pass left_padding)")
    pad = mx.zeros((1,), mx.int32) if left_padding is None else mx.array(left_padding, mx.int32)
    mask = masks_lib.attention_mask(mx.arange(offset + N), offset, N, offset - pad, window_size)
    return mask[0, 0] if left_padding is None else mask


def create_attention_mask(h, cache=None, window_size=None, return_array=False):
    """mlx-lm's mask for hidden states ``h`` ``(B, N, D)``: None for one query, the
    string ``"causal"`` when a plain causal mask does, else a boolean array from the
    one mask path (``return_array=True`` always gives the array). ``cache`` is one
    layer's cache (its tokens come before the queries)."""
    N = h.shape[1]
    before = 0 if cache is None else int(getattr(cache, "size", 0) or 0)
    binds = window_size is not None and before + N > window_size
    if not return_array and not binds:
        return None if N == 1 else "causal"
    if cache is None:
        return create_causal_mask(N, 0, window_size)
    offset = mx.full((h.shape[0],), before, mx.int32)
    return masks_lib.attention_mask(cache.key_slots(N), before, N, offset,
                                    cache.effective_window(window_size))


def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's attention entry point on the shared op: ``(B, H, L, D)`` queries,
    keys/values with as many or fewer heads; ``mask`` None, ``"causal"`` or boolean."""
    from .layers import scaled_dot_product_attention as attention  # layers imports base

    L, K = queries.shape[2], keys.shape[2]
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or an array, got {mask!r}")
        mask = masks_lib.attention_mask(mx.arange(K), K - L, L,
                                        mx.full((queries.shape[0],), K - L, mx.int32))
    return attention(queries, keys, values, scale, mask, sinks=sinks)
