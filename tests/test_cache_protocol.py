"""Every layer cache class implements the declared cache contract (cache/protocol.py), with
the protocol's parameter names, so the batch driver, the masks and the files can rely on it."""

import inspect

import pytest

from mlx_lm_batched.cache.kv import KVCache
from mlx_lm_batched.cache.protocol import KVLayerCache, LayerCache
from mlx_lm_batched.cache.quantized import QuantizedKVCache
from mlx_lm_batched.cache.ragged import RaggedStateCache
from mlx_lm_batched.cache.rotating import RotatingKVCache
from mlx_lm_batched.cache.state import StateCache

CACHES = {
    "KVCache": (KVCache, KVLayerCache),
    "RotatingKVCache": (lambda: RotatingKVCache(8), KVLayerCache),
    "RotatingKVCache(keep)": (lambda: RotatingKVCache(8, keep=4), KVLayerCache),
    "StateCache": (StateCache, LayerCache),
    "QuantizedKVCache": (QuantizedKVCache, KVLayerCache),
    "QuantizedKVCache(ring)": (lambda: QuantizedKVCache(64, 4, max_size=8), KVLayerCache),
    "RaggedStateCache": (RaggedStateCache, LayerCache),
}


def protocol_methods(protocol):
    return {name: member for name, member in inspect.getmembers(protocol)
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))}


@pytest.mark.parametrize("name", sorted(CACHES))
def test_cache_class_implements_the_protocol(name):
    make, protocol = CACHES[name]
    cache = make()
    assert isinstance(cache, protocol)
    assert cache.empty() and cache.size == 0 and cache.state == [] and cache.nbytes == 0
    for method, declared in protocol_methods(protocol).items():
        impl = getattr(type(cache), method)
        if isinstance(declared, property):
            assert isinstance(impl, property), (name, method)
            continue
        want = list(inspect.signature(declared).parameters)
        params = inspect.signature(impl).parameters
        got = list(params)
        # A class may add optional parameters after the declared ones (a ring that
        # keeps sinks takes the rows' ``offset``); callers of the protocol never pass them.
        extra = [p for p in got[len(want):] if params[p].default is inspect.Parameter.empty]
        assert got[: len(want)] == want and not extra, (name, method, got, want)


def test_protocol_rejects_a_cache_missing_a_method():
    # A cache class that leaves out part of the contract is not a LayerCache, so the
    # test above fails for it.
    class NoLayout(StateCache):
        layout_key = None

    assert isinstance(StateCache(), LayerCache)
    assert not isinstance(NoLayout(), LayerCache)
