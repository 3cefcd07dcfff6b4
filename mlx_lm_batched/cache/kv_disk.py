"""The disk tier of the KV block store (``kv_blocks.py``): one safetensors file a block.

``DiskTier(directory, max_bytes)`` keeps blocks as ``<key hex>.safetensors`` files with
the arrays ``k.<layer>`` / ``v.<layer>`` and metadata: format version, key, parent key,
token ids, adapter slot, model fingerprint and a checksum of the arrays' bytes.

Write-through: the block store writes every new full block here when it is made, not
when memory evicts it. A server killed with ``kill -9`` (or crashing) then loses
nothing, and a second server process on the same directory finds a block as soon as
the first one has computed it. Blocks are immutable, so a block is written once.

A write goes to a temporary name and is renamed (``os.replace``): a reader never sees
half a file. A read verifies everything it can (metadata, names, shapes, checksum); a
corrupt, truncated or foreign file is skipped with a warning and never served. The
directory is bounded by ``max_bytes``: past it the least recently used files (by
modification time; a read refreshes it) are deleted.
"""

import hashlib
import json
import logging
import os
import uuid

import mlx.core as mx
import numpy as np

log = logging.getLogger("mlx_lm_batched.kv_disk")

FORMAT_VERSION = "1"
SUFFIX = ".safetensors"


def arrays_checksum(arrays):
    """blake2b hex digest of the bytes of ``arrays`` (a name -> array dict), name order."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        x = arrays[name]
        h.update(f"{name}:{x.dtype}:{tuple(x.shape)};".encode())
        h.update(np.asarray(x.reshape(-1).view(mx.uint8)).tobytes())
    return h.hexdigest()


class DiskTier:
    """Blocks as files in ``directory`` (created if missing), at most ``max_bytes``."""

    def __init__(self, directory, max_bytes=8 << 30):
        if max_bytes < 0:
            raise ValueError("DiskTier: max_bytes must be >= 0")
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self.skipped = 0  # files refused on read (corrupt, truncated, foreign)
        self.files, self.nbytes = self._scan_totals()

    def path(self, key):
        return os.path.join(self.directory, key.hex() + SUFFIX)

    def _listing(self):
        """``[(mtime, size, path)]`` of the block files now in the directory."""
        out = []
        with os.scandir(self.directory) as it:
            for entry in it:
                if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:  # another process evicted it
                        continue
                    out.append((st.st_mtime, st.st_size, entry.path))
        return out

    def _scan_totals(self):
        listing = self._listing()
        return len(listing), sum(size for _, size, _ in listing)

    def write(self, block, adapter, fingerprint):
        """Write ``block`` (a ``kv_blocks.Block``) unless its file exists; then keep
        the directory under its bound."""
        final = self.path(block.key)
        if os.path.exists(final):
            return
        arrays = {}
        for i, (k, v) in enumerate(zip(block.keys, block.values)):
            arrays[f"k.{i}"], arrays[f"v.{i}"] = k, v
        metadata = {"format": FORMAT_VERSION, "key": block.key.hex(), "parent": block.parent.hex(),
                    "tokens": json.dumps(list(block.tokens)), "adapter": str(int(adapter)),
                    "fingerprint": fingerprint.hex(), "layers": str(len(block.keys)),
                    "checksum": arrays_checksum(arrays)}
        tmp = os.path.join(self.directory, f".{block.key.hex()}.{uuid.uuid4().hex}.tmp{SUFFIX}")
        try:
            mx.save_safetensors(tmp, arrays, metadata=metadata)
            size = os.path.getsize(tmp)
            os.replace(tmp, final)
        except OSError as e:
            log.warning("kv disk tier: cannot write %s: %s", final, e)
            try:
                os.remove(tmp)
            except OSError:
                pass
            return
        self.files += 1
        self.nbytes += size
        if self.nbytes > self.max_bytes:
            self._evict()

    def _evict(self):
        """Delete the least recently used files until the directory fits its bound
        (the listing is read again: other processes write here too)."""
        listing = sorted(self._listing())
        total = sum(size for _, size, _ in listing)
        while listing and total > self.max_bytes:
            _, size, path = listing.pop(0)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            total -= size
        self.files, self.nbytes = len(listing), total

    def _skip(self, path, why):
        self.skipped += 1
        log.warning("kv disk tier: skipping %s: %s", path, why)
        return None

    def read(self, key, parent, tokens, adapter, fingerprint, block_size):
        """The block ``key``'s ``(keys, values)`` per-layer lists, or None when it is not
        on disk or its file does not check out (then a warning names the file)."""
        path = self.path(key)
        if not os.path.exists(path):
            return None
        try:
            arrays, meta = mx.load(path, return_metadata=True)
        except Exception as e:  # truncated or not safetensors at all
            return self._skip(path, f"unreadable ({e})")
        want = {"format": FORMAT_VERSION, "key": key.hex(), "parent": parent.hex(),
                "tokens": json.dumps(list(tokens)), "adapter": str(int(adapter)),
                "fingerprint": fingerprint.hex()}
        for name, value in want.items():
            if meta.get(name) != value:
                return self._skip(path, f"metadata {name!r} does not match this block")
        try:
            layers = int(meta.get("layers", "-1"))
        except ValueError:
            layers = -1
        names = {f"{p}.{i}" for p in "kv" for i in range(max(layers, 0))}
        if layers < 1 or set(arrays) != names:
            return self._skip(path, "its arrays are not one block's layers")
        keys = [arrays[f"k.{i}"] for i in range(layers)]
        values = [arrays[f"v.{i}"] for i in range(layers)]
        for x in keys + values:
            if x.ndim != 4 or x.shape[0] != 1 or x.shape[2] != block_size:
                return self._skip(path, f"an array of shape {tuple(x.shape)} is not "
                                  f"(1, heads, {block_size}, dim)")
        if any(k.shape[:3] != v.shape[:3] for k, v in zip(keys, values)):
            return self._skip(path, "keys and values disagree in shape")
        if meta.get("checksum") != arrays_checksum(arrays):
            return self._skip(path, "checksum mismatch (corrupt)")
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return keys, values

    def stats(self):
        """``disk_blocks``, ``disk_bytes``, ``disk_bytes_bound``, ``disk_skipped``."""
        return {"disk_blocks": self.files, "disk_bytes": self.nbytes,
                "disk_bytes_bound": self.max_bytes, "disk_skipped": self.skipped}
