"""Prompt-cache files in mlx-lm 0.32's layout (tree-flattened ``state`` per cache, class
names and scalar markers in the metadata), so caches move between the two libraries
both ways for the kinds both have (``KVCache``, ``RotatingKVCache``, ``QuantizedKVCache``,
``ChunkedKVCache``, ``CacheList`` of those, and ``StateCache`` as mlx-lm's
``ArraysCache``); the rows' padding goes into one extra metadata key that mlx-lm
ignores."""

import os

import mlx.core as mx

from .cache_list import CacheList
from .chunked import ChunkedKVCache
from .kv import KVCache
from .prompt_cache import PromptCache, batch_rows
from .quantized import QuantizedKVCache
from .rotating import RotatingKVCache
from .state import StateCache

PADDING_KEY = "mlx_lm_batched_padding"  # user-metadata key of the rows' padding


# user-metadata key of the state caches' slot counts ("layer:slots,..."; a layer inside
# a CacheList is "layer.part.0"), which mlx-lm's ``ArraysCache`` does not keep
STATE_SLOTS_KEY = "mlx_lm_batched_state_slots"


def _layer_state(c, padded=False):
    """mlx-lm 0.32's ``state`` of a layer cache: a tuple of arrays and ints (``padded``:
    rows with padding, which mlx-lm's layout cannot hold; a ring's sinks then follow)."""
    if type(c) is CacheList:  # mlx-lm's [(state, class name), ...]
        return [[_layer_state(part, padded), _class_name(part)] for part in c.caches]
    if type(c) is ChunkedKVCache:  # mlx-lm's (keys, values, offset, chunk_size, start)
        k, v = c.state or (None, None)
        return [k, v, c.offset, c.chunk_size, c.start_position]
    if type(c) is KVCache:
        k, v = c.state or (None, None)
        return [k, v, c.size]
    if type(c) is RotatingKVCache:
        k, v = c.ordered()
        if c.keep and padded:  # each row's sinks by position, beside the slot ring
            n = 0 if k is None else k.shape[2]
            return [k, v, c.size, c.keep, c.max_size, n, c.sink_keys, c.sink_values]
        if c.keep and c.size > c.max_size:
            # mlx-lm's layout in time order: the sinks, then the last max_size - keep.
            tail = c.max_size - c.keep
            k = mx.concatenate([c.sink_keys, k[..., -tail:, :]], axis=2)
            v = mx.concatenate([c.sink_values, v[..., -tail:, :]], axis=2)
        n = 0 if k is None else k.shape[2]
        return [k, v, c.size, c.keep, c.max_size, n]
    if type(c) is QuantizedKVCache:  # mlx-lm's (keys, values, offset, group_size, bits)
        k, v = c.ordered()
        state = [list(k) if k else None, list(v) if v else None, c.size, c.group_size, c.bits]
        return state if c.max_size is None else state + [c.max_size]
    if type(c) is StateCache:  # mlx-lm's ArraysCache: (arrays, left_padding, lengths)
        return [list(c.arrays), None, None]
    raise ValueError(f"cannot save a {type(c).__name__} cache (KVCache, RotatingKVCache, "
                     "QuantizedKVCache, ChunkedKVCache, CacheList and StateCache only)")


def _flatten(value, key):
    """``(key, leaf)`` pairs of a nested state as mlx-lm's ``tree_flatten`` names them."""
    if isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            yield from _flatten(item, f"{key}.{j}")
    else:
        yield key, value


def _state_slots(c, key):
    """``(key, slots)`` of every ``StateCache`` in layer cache ``c`` (``key``: its entry)."""
    if type(c) is StateCache:
        yield key, c.size
    elif type(c) is CacheList:
        for j, part in enumerate(c.caches):
            yield from _state_slots(part, f"{key}.{j}.0")


_CLASS_NAMES = {StateCache: "ArraysCache"}  # mlx-lm's name for the same layout


def _class_name(c):
    # A quantized ring (sliding-window layer) has no mlx-lm class: its own name.
    if type(c) is QuantizedKVCache and c.max_size is not None:
        return "QuantizedRotatingKVCache"
    return _CLASS_NAMES.get(type(c), type(c).__name__)


def save_prompt_cache(file_name, cache, metadata=None):
    """Save caches (and optional string metadata) to a ``.safetensors`` file that
    mlx-lm 0.32's ``load_prompt_cache`` also reads; a ``PromptCache``'s row padding,
    when any, is kept under the metadata key ``PADDING_KEY`` (mlx-lm returns it with
    the user metadata)."""
    arrays, scalars = {}, []
    padding = getattr(cache, "padding", None)
    padded = padding is not None and any(padding)
    for i, c in enumerate(cache):
        for key, value in _flatten(_layer_state(c, padded), str(i)):
            if value is None:
                arrays[key] = mx.array([])
                scalars.append((key, "none"))
            elif isinstance(value, int):
                arrays[key] = mx.array(value)
                scalars.append((key, "scalar"))
            elif isinstance(value, str):  # a CacheList's class names, as mlx-lm writes them
                arrays[key] = mx.array([ord(ch) for ch in value])
                scalars.append((key, "string"))
            else:
                arrays[key] = value
    info = {f"0.{k}": str(v) for k, v in (metadata or {}).items()}
    padding = getattr(cache, "padding", None)
    if padding is not None and any(padding):  # unpadded rows need no record
        info[f"0.{PADDING_KEY}"] = ",".join(map(str, padding))
    slots = [f"{k}:{n}" for i, c in enumerate(cache) for k, n in _state_slots(c, str(i))]
    if slots:
        info[f"0.{STATE_SLOTS_KEY}"] = ",".join(slots)
    info.update({f"1.{i}": _class_name(c) for i, c in enumerate(cache)})
    info["2.0"] = ""  # mlx-lm keeps the scalar list non-empty with this entry
    for n, (key, kind) in enumerate(scalars, start=1):
        info[f"2.{n}.0"], info[f"2.{n}.1"] = key, kind
    mx.save_safetensors(file_name, arrays, metadata=info)


def load_prompt_cache(file_name, return_metadata=False):
    """Load a ``PromptCache`` saved here or by mlx-lm 0.32's ``save_prompt_cache``.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` (naming the
    file and the problem) for a corrupt one, one of another kind, or caches of a
    kind this library does not have.
    """
    if not os.path.isfile(file_name):
        raise FileNotFoundError(f"prompt cache file not found: {file_name}")
    try:
        arrays, info = mx.load(str(file_name), format="safetensors", return_metadata=True)
    except Exception as e:  # mlx raises RuntimeError/ValueError for unreadable files
        raise ValueError(f"{file_name}: not a readable safetensors file ({e})") from None
    if not isinstance(arrays, dict) or not isinstance(info, dict):
        raise ValueError(f"{file_name}: not a safetensors prompt cache file")
    try:
        cache, padding, user = _parse(arrays, info)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"{file_name}: not a valid prompt cache file ({e})") from None
    cache = PromptCache(cache, padding)
    return (cache, user) if return_metadata else cache


def _parse(arrays, info):
    classes = {}
    for key, value in info.items():
        if key.startswith("1.") and key[2:].isdigit():
            classes[int(key[2:])] = value
    if not classes or sorted(classes) != list(range(len(classes))):
        raise ValueError("no cache classes in its metadata")
    kinds = {}
    for key, value in info.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "2" and parts[2] == "0":
            kinds[value] = info[f"2.{parts[1]}.1"]
    values = {key: _value(a, kinds.get(key)) for key, a in arrays.items()}
    user = {k[2:]: v for k, v in info.items() if k.startswith("0.")}
    state_slots = dict((k, int(n)) for k, n in (
        p.split(":") for p in user.pop(STATE_SLOTS_KEY, "").split(",") if p))
    cache = [_build_layer(classes[i], values, str(i), state_slots) for i in range(len(classes))]
    padding = user.pop(PADDING_KEY, None)
    if padding is not None:
        padding = [int(p) for p in padding.split(",")] if padding else []
        rows = next((n for n in map(batch_rows, cache) if n), len(padding))
        first = cache[0].caches[0] if type(cache[0]) is CacheList else cache[0]
        slots = first.size
        if len(padding) != rows or any(p < 0 or p > slots for p in padding):
            raise ValueError(f"row padding {padding} does not fit {rows} rows of {slots} slots")
    return cache, padding, user


def _value(a, kind):
    """A saved entry as the state holds it (mlx-lm's scalar kinds)."""
    if kind == "none":
        return None
    if kind == "scalar":
        return int(a.item())
    if kind == "string":
        return "".join(chr(int(x)) for x in a.tolist())
    return a


def _build_layer(name, values, i, state_slots):
    """The layer cache of class ``name`` from the entries under key ``i``."""
    if name == "CacheList":  # mlx-lm's entries: i.j.0 (part j's state), i.j.1 (its class)
        parts, j = [], 0
        while f"{i}.{j}.1" in values:
            parts.append(_build_layer(values[f"{i}.{j}.1"], values, f"{i}.{j}.0", state_slots))
            j += 1
        return CacheList(*parts)
    if name == "ArraysCache":
        return _build_state(values, i, state_slots.get(i, 0))
    if name.startswith("Quantized"):
        return _build_quantized(name, values, i)
    if name == "ChunkedKVCache":
        return _build_chunked(*(values.get(f"{i}.{j}") for j in range(5)))
    return _build(name, [values.get(f"{i}.{j}") for j in range(8)], i)


def _build_chunked(keys, values, offset, chunk_size, start_position):
    """A ``ChunkedKVCache`` from mlx-lm's state: its buffers hold the tokens since
    ``start_position`` (then unused slots)."""
    c = ChunkedKVCache(chunk_size)
    c.start_position = start_position
    if keys is not None:
        held = offset - start_position
        c.load_ordered(keys[..., :held, :], values[..., :held, :], held)
    return c


def _build_state(values, i, slots):
    """A ``StateCache`` from mlx-lm's ``ArraysCache`` entries ``i.0.k``."""
    n = 0
    while f"{i}.0.{n}" in values:
        n += 1
    c = StateCache(n)
    c.arrays = [values[f"{i}.0.{k}"] for k in range(n)]
    if values.get(f"{i}.1") is not None or values.get(f"{i}.2") is not None:
        raise ValueError(f"layer {i}: ArraysCache saved mid-batch by mlx-lm (left_padding "
                         "or lengths set) is not supported")
    c.size = slots
    return c


def _build_quantized(name, values, i):
    """A ``QuantizedKVCache`` from entries ``i.0.k`` (keys), ``i.1.k`` (values), then
    offset, group size, bits (and the window of a ring)."""
    if name not in ("QuantizedKVCache", "QuantizedRotatingKVCache"):
        raise ValueError(f"layer {i}: {name} caches are not supported")
    offset, group_size, bits = (values[f"{i}.{j}"] for j in (2, 3, 4))
    ring = values[f"{i}.5"] if name == "QuantizedRotatingKVCache" else None
    c = QuantizedKVCache(group_size, bits, ring)
    if f"{i}.0.0" in values:
        keys = [values[f"{i}.0.{k}"] for k in range(3)]
        vals = [values[f"{i}.1.{k}"] for k in range(3)]
        if ring is None:  # mlx-lm saves its whole buffers: keep the slots it holds
            keys, vals = ([x[..., :offset, :] for x in t] for t in (keys, vals))
        c.load_ordered(keys, vals, offset)
    return c


def _build(name, state, i):
    keys, values, offset = state[0], state[1], state[2]
    if name == "KVCache":
        c = KVCache()
        if keys is not None:
            c.load_ordered(keys[..., :offset, :], values[..., :offset, :], offset)
        return c
    if name == "RotatingKVCache":
        keep, max_size, idx = state[3], state[4], state[5]
        c = RotatingKVCache(max_size, keep)
        if keys is not None and keep and state[6] is None:
            _load_sinks(c, keys, values, offset, idx)
        elif keys is not None:
            if keep:  # padded rows: each row's sinks were saved beside the ring
                c.sink_keys, c.sink_values = state[6], state[7]
            # mlx-lm's ring: write index ``idx``; put it in time order, keep the window.
            n = keys.shape[2]
            order = lambda x: (x if idx == n else mx.concatenate([x[..., idx:, :], x[..., :idx, :]], 2)
                               if idx < offset else x[..., :idx, :])
            held = min(offset, max_size)
            c.load_ordered(order(keys)[..., -held:, :], order(values)[..., -held:, :], offset)
        return c
    raise ValueError(f"layer {i}: {name} caches are not supported (KVCache, RotatingKVCache, "
                     "QuantizedKVCache, ChunkedKVCache, CacheList and ArraysCache only)")


def _load_sinks(c, keys, values, offset, idx):
    """Fill ``c`` (a ring that keeps ``c.keep`` sinks) from mlx-lm's layout: the sinks
    at indices ``[0, keep)``, then a ring of the other slots with write index ``idx``."""
    keep, M = c.keep, c.max_size
    n = keys.shape[2]

    def ordered(x):  # mlx-lm's ``_temporal_order``
        if idx == n:
            return x
        if idx < offset:
            return mx.concatenate([x[..., :keep, :], x[..., idx:, :], x[..., keep:idx, :]], 2)
        return x[..., :idx, :]

    keys, values = ordered(keys), ordered(values)
    sinks = min(keep, offset)
    pad = lambda x, m: mx.concatenate(
        [x, mx.zeros((*x.shape[:2], m, x.shape[3]), x.dtype)], axis=2) if m else x
    c.sink_keys = pad(keys[..., :sinks, :], keep - sinks)
    c.sink_values = pad(values[..., :sinks, :], keep - sinks)
    if offset <= M:  # the ring still holds every slot
        c.load_ordered(keys, values, offset)
        return
    # The slots before the last ``M - keep`` are never seen again: zeros fill the ring.
    tail = lambda x: mx.concatenate([mx.zeros((*x.shape[:2], keep, x.shape[3]), x.dtype),
                                     x[..., -(M - keep):, :]], axis=2)
    c.load_ordered(tail(keys), tail(values), offset)
