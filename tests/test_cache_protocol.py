"""Every layer cache class implements the declared cache contract (cache/protocol.py), with
the protocol's parameter names, so the batch driver, the masks and the files can rely on it."""

import inspect

import pytest

from mlx_lm_batched.cache.kv import KVCache, RotatingKVCache
from mlx_lm_batched.cache.protocol import KVLayerCache, LayerCache
from mlx_lm_batched.cache.quantized import QuantizedKVCache
from mlx_lm_batched.cache.ragged import RaggedStateCache
from mlx_lm_batched.cache.state import StateCache

CACHES = {
    "KVCache": (KVCache, KVLayerCache),
    "RotatingKVCache": (lambda: RotatingKVCache(8), KVLayerCache),
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
        got = list(inspect.signature(impl).parameters)
        assert got == want, (name, method, got, want)


def test_protocol_rejects_a_cache_missing_a_method():
    # A cache class that leaves out part of the contract is not a LayerCache, so the
    # test above fails for it.
    class NoLayout(StateCache):
        layout_key = None

    assert isinstance(StateCache(), LayerCache)
    assert not isinstance(NoLayout(), LayerCache)
