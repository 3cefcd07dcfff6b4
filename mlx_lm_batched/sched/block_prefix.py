"""Prefix reuse over shared KV blocks (``cache/kv_blocks.py``), with the whole-cache LRU's
interface, and the one place a serving loop picks between the two.

:func:`make_prefix_cache` returns a :class:`BlockPrefixCache` for models whose layers
are all plain full-attention KV caches (``kv_blocks.block_cacheable``) with float KV,
else the whole-cache ``LRUPromptCache`` (sliding-window, recurrent and hybrid models,
``kv_bits``). Both answer ``fetch_nearest_cache`` / ``insert_cache`` / ``hold`` /
``release`` / ``gauges`` / ``describe`` / ``close``.

A block hit covers whole blocks only (the partial last block of a stored sequence is
private to its row), so a prompt reuses ``block_size * k`` tokens: the rest, at most
``block_size - 1`` more than the LRU would compute, is prefilled.
"""

import dataclasses
import hashlib
import json
import logging

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ..cache.factory import make_prompt_cache
from ..cache.row_caches import copy_cache
from ..cache.kv_blocks import DEFAULT_BLOCK_SIZE, BlockStore, block_cacheable
from ..cache.kv_disk import DiskTier
from .prefix_cache import LRUPromptCache

log = logging.getLogger("mlx_lm_batched.server")

SAMPLE_BYTES = 1 << 16  # bytes of each sampled tensor that enter the fingerprint


def _config_text(model):
    args = getattr(model, "args", None)
    if dataclasses.is_dataclass(args):
        args = dataclasses.asdict(args)
    elif args is not None:
        args = dict(vars(args))
    return json.dumps(args, sort_keys=True, default=str)


def _sample(x):
    flat = x.reshape(-1)
    n = max(1, SAMPLE_BYTES // max(1, x.dtype.size))
    return np.asarray(flat[:n].view(mx.uint8)).tobytes()


def model_fingerprint(model):
    """16 bytes naming a model's weights: its config, and every parameter's name, shape,
    dtype and leading bytes (adapter tensors, LoRA/DoRA, included). Another model,
    another quantization or other adapters give another fingerprint; hashing the
    leading 64 KiB of each tensor costs milliseconds, not a pass over the weights."""
    h = hashlib.blake2b(digest_size=16)
    h.update(type(model).__module__.encode() + b"\0" + _config_text(model).encode())
    for name, x in tree_flatten(model.parameters()):
        h.update(f"{name}:{tuple(x.shape)}:{x.dtype};".encode())
        h.update(_sample(x))
    return h.digest()


@dataclasses.dataclass
class ParkedRow:
    """What :meth:`BlockPrefixCache.park` keeps of a preempted row beside its stored
    blocks: the tokens its cache held, how many of them full blocks hold, and per layer
    the ``(keys, values)`` of the rest."""

    tokens: list
    full: int
    tail: list


class BlockCache(list):
    """A prefix cache assembled from blocks (a list of layer caches); ``keys`` are the
    blocks it pins until :meth:`BlockPrefixCache.release`."""

    keys = ()


class BlockPrefixCache:
    """``LRUPromptCache``'s interface over a :class:`BlockStore` of one model.

    ``hold(uid, cache)`` ties a fetched cache's pinned blocks to row ``uid``;
    ``release(uid)`` drops them when the row leaves.
    """

    def __init__(self, model, store):
        self.model, self.store = model, store
        self._held = {}  # uid -> pinned block keys

    def __len__(self):
        return len(self.store)

    @property
    def nbytes(self):
        return self.store.nbytes

    def fetch_nearest_cache(self, model, tokens, adapter=0):
        """``(cache of the longest stored block run, tokens still to process)``; at
        least one token is left. ``(None, tokens)`` on a miss."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("fetch_nearest_cache: empty token list")
        hit = self.store.lookup(tokens, adapter)
        if hit.cache is None:
            return None, tokens
        # Unpinned until ``hold``: a fetched cache whose row is never inserted (the
        # request failed its checks) must not keep its blocks pinned.
        self.store.release(hit.keys)
        cache = BlockCache(hit.cache)
        cache.keys = hit.keys
        return cache, tokens[hit.tokens:]

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type="assistant", adapter=0):
        """Store the full blocks of one row's cache of ``tokens`` (shared ones once)."""
        self.store.insert(list(tokens), prompt_cache, adapter)

    def hold(self, uid, cache):
        """Row ``uid`` was inserted with ``cache``: pin the blocks a fetched cache came
        from while the row runs (it reads their arrays in place; a block the store let go
        in between stays alive through the row, only uncounted)."""
        keys = list(getattr(cache, "keys", ()))
        held = next((i for i, k in enumerate(keys) if k not in self.store), len(keys))
        if held:
            self.store.acquire(keys[:held])
            self._held[uid] = keys[:held]

    def release(self, uid):
        """Row ``uid`` left: unpin the blocks its prefix came from."""
        keys = self._held.pop(uid, None)
        if keys:
            self.store.release(keys)

    def reused_tokens(self, prompt, adapter=0):
        """Tokens of ``prompt`` a fetch now would take from blocks in memory, which a row
        reads in place (not its own memory)."""
        return self.store.held_tokens(prompt, adapter)

    def park(self, model, tokens, cache, adapter=0):
        """Keep a preempted row's ``cache`` of ``tokens`` for :meth:`unpark`: its full blocks
        go to the store (memory, then the disk tier, shared like any prefix), and the slots
        past the last full block, less than a block, stay with the returned
        :class:`ParkedRow`, so that a resume recomputes nothing it held."""
        tokens = list(tokens)
        self.insert_cache(model, tokens, cache, adapter=adapter)
        full = len(tokens) // self.store.block_size * self.store.block_size
        tail = []
        for layer in cache:
            keys, values = layer.state
            # Copies: a slice would keep the row's whole buffer alive.
            tail.append((mx.array(keys[..., full:, :]), mx.array(values[..., full:, :])))
        mx.eval(tail)
        return ParkedRow(tokens, full, tail)

    def unpark(self, model, parked, tokens, adapter=0):
        """``(cache, tokens it holds)`` to resume a row whose tokens are now ``tokens``
        (what it held when parked, then the token it had sampled): the stored blocks plus
        the parked slots when every block is still found, else the blocks found (the row
        recomputes the rest). ``(None, 0)`` when nothing is found."""
        cache, rest = self.fetch_nearest_cache(model, tokens, adapter)
        held = len(tokens) - len(rest)
        if parked is None or held != parked.full or list(tokens[:len(parked.tokens)]) != parked.tokens:
            return cache, held
        own = BlockCache(copy_cache(cache) if cache is not None else make_prompt_cache(model))
        own.keys = cache.keys if cache is not None else ()
        for layer, (keys, values) in zip(own, parked.tail):
            if keys.shape[2]:
                layer.update_and_fetch(keys, values)
        return own, len(parked.tokens)

    def close(self):
        """Wait until the disk tier's queued blocks are written (server shutdown)."""
        if self.store.disk is not None:
            self.store.disk.close()

    def gauges(self):
        """The store's gauges and hit counters, for ``server.metrics``."""
        return self.store.stats()

    def describe(self):
        """One line for the startup log."""
        s = self.store
        disk = (f"; disk tier {s.disk.directory} ({s.disk.files} blocks, {s.disk.nbytes} of "
                f"{s.disk.max_bytes} bytes)" if s.disk is not None else "; no disk tier")
        return (f"KV blocks of {s.block_size} tokens, {len(s)} blocks / {s.nbytes} bytes in "
                f"memory of {s.max_bytes}{disk}")


def make_prefix_cache(model, *, entries=10, max_bytes=1 << 30, kv_bits=None,
                      block_size=DEFAULT_BLOCK_SIZE, disk_dir=None, disk_bytes=8 << 30,
                      blocks=True):
    """The prefix cache a serving loop uses for ``model``: shared KV blocks when the
    model's layers are plain float KV caches (and ``blocks``), else the whole-cache LRU
    of ``entries`` entries. ``max_bytes`` bounds either in memory; ``disk_dir`` adds the
    block store's disk tier (bounded by ``disk_bytes``)."""
    if blocks and kv_bits is None and block_cacheable(make_prompt_cache(model)):
        disk = DiskTier(disk_dir, disk_bytes) if disk_dir else None
        return BlockPrefixCache(model, BlockStore(model_fingerprint(model), block_size,
                                                  max_bytes, disk))
    if disk_dir:
        log.warning("--kv-disk-dir %s is not used: prefixes stay in the in-memory LRU here "
                    "(the model's caches are not plain float KV caches, or --kv-bits or "
                    "--distributed is on)", disk_dir)
    return LRUPromptCache(entries, max_bytes)
