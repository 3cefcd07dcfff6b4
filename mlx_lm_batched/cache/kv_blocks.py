"""A store of key/value blocks that prompts share: content-addressed, reference counted.

A block is one span of ``block_size`` tokens across every attention layer of the model:
per layer, the ``(1, H, block_size, D)`` keys and values those tokens left in the cache.
Full blocks are immutable and named by their content and their past (as vLLM's prefix
caching does)::

    key_i = blake2b(key_{i-1}, adapter slot, model fingerprint, tokens[i*B:(i+1)*B])

so two prompts that start alike reach the same keys and share the same blocks: a system
prompt many conversations open with is held once, however many rows used it. The
partial last block of a sequence is never stored (it is private to its row).

- ``insert(tokens, cache)`` splits a finished row's cache into full blocks. Each new
  block is a materialized copy (the row's own cache can be freed); a block already held
  is shared, not stored twice.
- ``lookup(tokens)`` walks the prompt's chain and returns the longest run of held
  blocks (always leaving at least one prompt token to compute) as the per-layer caches
  ``BatchGenerator.insert(caches=...)`` takes, which hold the blocks' arrays as a shared
  head (``row_blocks.py``): the rows reusing a prefix read one copy of it. The blocks of a hit are
  pinned (a reference each) until ``release``: a pinned block is never evicted.
- Blocks nobody references sit in an LRU and are evicted when the byte bound needs
  room. With a disk tier (``kv_disk.DiskTier``), every new block is also queued for its
  background writer (write-behind: ``insert`` does not wait for the disk) and a block
  missing from memory is read back from it.

Which models: those whose layer caches are all plain full-attention ``KVCache`` (float
keys and values). Sliding-window (``RotatingKVCache``), recurrent/state and hybrid
models, and quantized KV caches (``--kv-bits``: a row's layers switch to quantized at
``quantized_kv_start``, so its prefix blocks would not be one format) keep the whole-cache
LRU (``sched/prefix_cache.py``). The choice is made by :func:`block_cacheable` alone.
"""

import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .kv import KVCache

DEFAULT_BLOCK_SIZE = 32

log = logging.getLogger("mlx_lm_batched.kv_blocks")


def _layout(keys, values):
    return [(tuple(k.shape), k.dtype, tuple(v.shape), v.dtype) for k, v in zip(keys, values)]


def block_cacheable(prompt_cache):
    """True when every layer of ``prompt_cache`` (a list of layer caches, e.g. a fresh
    ``make_prompt_cache(model)``) is a plain full-attention ``KVCache``: the one test
    deciding between the block store and the whole-cache LRU."""
    return bool(prompt_cache) and all(type(c) is KVCache for c in prompt_cache)


def block_key(parent, tokens, adapter, fingerprint):
    """The 16-byte key of a block of ``tokens`` after the block ``parent`` (b"" first)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(len(parent).to_bytes(1, "little") + parent)
    h.update(int(adapter).to_bytes(8, "little", signed=True))
    h.update(len(fingerprint).to_bytes(1, "little") + fingerprint)
    h.update(np.asarray(tokens, dtype="<i8").tobytes())
    return h.digest()


@dataclass
class Block:
    """One full block: its key, its parent's key, its tokens and per-layer arrays."""

    key: bytes
    parent: bytes
    tokens: tuple
    keys: list  # per layer: (1, H, block_size, Dk)
    values: list  # per layer: (1, H, block_size, Dv)
    refs: int = 0
    nbytes: int = field(init=False)

    def __post_init__(self):
        self.nbytes = sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values))


@dataclass
class Hit:
    """A lookup's result: the assembled cache (None when nothing is held), the pinned
    block keys, and how many of the reused tokens came from memory and from disk."""

    cache: list
    keys: list
    memory_tokens: int = 0
    disk_tokens: int = 0

    @property
    def tokens(self):
        return self.memory_tokens + self.disk_tokens


class BlockStore:
    """Content-addressed KV blocks of one model, bounded by ``max_bytes`` in memory.

    ``fingerprint``: bytes naming the model (``sched.block_prefix.model_fingerprint``);
    ``disk``: an optional ``kv_disk.DiskTier`` (written behind, read on a miss).
    """

    def __init__(self, fingerprint, block_size=DEFAULT_BLOCK_SIZE, max_bytes=1 << 30, disk=None):
        if block_size < 1 or max_bytes < 0:
            raise ValueError("BlockStore: block_size must be >= 1 and max_bytes >= 0")
        self.fingerprint = bytes(fingerprint)
        self.block_size = int(block_size)
        self.max_bytes = int(max_bytes)
        self.disk = disk
        self._blocks = {}  # key -> Block (in memory)
        self._free = OrderedDict()  # keys of blocks with no reference, least recent first
        self.nbytes = 0
        self.hit_tokens = {"memory": 0, "disk": 0}

    def __len__(self):
        return len(self._blocks)

    def __contains__(self, key):
        return key in self._blocks

    def chain(self, tokens, adapter=0, n_blocks=None):
        """Keys of the full blocks of ``tokens`` (the first ``n_blocks`` of them)."""
        n = len(tokens) // self.block_size if n_blocks is None else n_blocks
        keys, parent = [], b""
        for i in range(n):
            span = tokens[i * self.block_size:(i + 1) * self.block_size]
            parent = block_key(parent, span, adapter, self.fingerprint)
            keys.append(parent)
        return keys

    # -- references and eviction --------------------------------------------------
    def acquire(self, keys):
        """Pin the blocks ``keys`` (held in memory) against eviction."""
        for k in keys:
            block = self._blocks[k]
            block.refs += 1
            self._free.pop(k, None)

    def release(self, keys):
        """Drop one reference from each block of ``keys``; unreferenced blocks join the
        LRU, the chain's last block first (the first block, the most shared, leaves last)."""
        for k in reversed(keys):
            block = self._blocks.get(k)
            if block is None or block.refs == 0:
                continue
            block.refs -= 1
            if block.refs == 0:
                self._free[k] = None

    def _make_room(self, nbytes):
        """Evict unreferenced blocks until ``nbytes`` more fit; False if they cannot."""
        while self.nbytes + nbytes > self.max_bytes and self._free:
            key, _ = self._free.popitem(last=False)
            self.nbytes -= self._blocks.pop(key).nbytes
        return self.nbytes + nbytes <= self.max_bytes

    def _add(self, block):
        if not self._make_room(block.nbytes):
            return False
        self._blocks[block.key] = block
        self._free[block.key] = None
        self.nbytes += block.nbytes
        return True

    # -- insert and lookup --------------------------------------------------------
    def insert(self, tokens, prompt_cache, adapter=0):
        """Store the full blocks of one row's cache of ``tokens``; returns how many
        blocks were new. A cache that is not block-cacheable stores nothing."""
        if not block_cacheable(prompt_cache):
            return 0
        held = min(len(tokens), min(c.size for c in prompt_cache))
        tokens = [int(t) for t in tokens[:held]]
        keys = self.chain(tokens, adapter)
        # Slots read where they are: a row continued from stored blocks holds them as a
        # shared head, so only its own slots are sliced (never the whole cache joined).
        readers = [c.span_reader() for c in prompt_cache] if keys else []
        new, pinned, parent = [], [], b""
        try:
            for i, key in enumerate(keys):
                if key not in self._blocks:
                    a, b = i * self.block_size, (i + 1) * self.block_size
                    spans = [read(a, b) for read in readers]
                    block = Block(key, parent, tuple(tokens[a:b]),
                                  [mx.contiguous(k) for k, _ in spans],
                                  [mx.contiguous(v) for _, v in spans])
                    if not self._add(block):
                        break  # memory is pinned full: later blocks would have no parent
                    new.append(block)
                self.acquire([key])  # the chain's head is not evicted to store its tail
                pinned.append(key)
                parent = key
        finally:
            self.release(pinned)  # back to the LRU, the first block most recently used
        mx.eval([(b.keys, b.values) for b in new])  # the copies, in one evaluation
        if self.disk is not None:
            for block in new:
                self.disk.write(block, adapter, self.fingerprint)
        return len(new)

    def held_run(self, tokens, adapter=0):
        """``(keys, held)``: the keys of the full blocks a :meth:`lookup` of ``tokens``
        walks (leaving >= 1 token) and how many of them, from the first, are in memory
        now (the disk tier not counted); pins nothing."""
        tokens = [int(t) for t in tokens]
        keys = self.chain(tokens, adapter, (len(tokens) - 1) // self.block_size)
        return keys, next((i for i, k in enumerate(keys) if k not in self._blocks), len(keys))

    def held_tokens(self, tokens, adapter=0):
        """Tokens of ``tokens`` a :meth:`lookup` now would take from memory."""
        return self.held_run(tokens, adapter)[1] * self.block_size

    def lookup(self, tokens, adapter=0):
        """The longest run of held blocks of ``tokens``, leaving >= 1 token: a
        :class:`Hit` whose blocks are pinned until ``release(hit.keys)``."""
        tokens = [int(t) for t in tokens]
        keys = self.chain(tokens, adapter, (len(tokens) - 1) // self.block_size)
        found, from_disk, parent = [], 0, b""
        for i, key in enumerate(keys):
            if key not in self._blocks:
                block = self._read_disk(key, parent, tokens, i, adapter)
                if block is None or not self._add(block):
                    break
                from_disk += 1
            found.append(key)
            self.acquire([key])  # pinned at once: a later disk read cannot evict it
            parent = key
        if not found:
            return Hit(None, [])
        blocks = [self._blocks[k] for k in found]
        # Each layer's cache reads the blocks' own arrays in place (a shared head,
        # ``row_blocks.py``): rows that reuse a prefix share its memory, never copy it.
        cache = [KVCache.sharing([b.keys[layer] for b in blocks],
                                 [b.values[layer] for b in blocks])
                 for layer in range(len(blocks[0].keys))]
        hit = Hit(cache, found, (len(found) - from_disk) * self.block_size,
                  from_disk * self.block_size)
        self.hit_tokens["memory"] += hit.memory_tokens
        self.hit_tokens["disk"] += hit.disk_tokens
        return hit

    def _read_disk(self, key, parent, tokens, i, adapter):
        if self.disk is None:
            return None
        span = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
        arrays = self.disk.read(key, parent, span, adapter, self.fingerprint, self.block_size)
        if arrays is None:
            return None
        model = next(iter(self._blocks.values()), None)  # a block of this model, if any
        if model is not None and _layout(model.keys, model.values) != _layout(*arrays):
            self.disk.skipped += 1
            log.warning("kv disk tier: skipping block %s: its layers' shapes or dtypes are "
                        "not this model's", key.hex())
            return None
        return Block(key, parent, span, *arrays)

    def stats(self):
        """Block counts and bytes (gauges), and the hit tokens so far (counters)."""
        in_use = sum(1 for b in self._blocks.values() if b.refs)
        out = {"blocks_in_use": in_use, "blocks_cached": len(self._blocks) - in_use,
               "block_bytes": self.nbytes, "block_bytes_bound": self.max_bytes,
               "hit_tokens_memory": self.hit_tokens["memory"],
               "hit_tokens_disk": self.hit_tokens["disk"]}
        if self.disk is not None:
            out.update(self.disk.stats())
        return out
