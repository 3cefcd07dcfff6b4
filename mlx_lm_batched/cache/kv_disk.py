"""The disk tier of the KV block store (``kv_blocks.py``): one safetensors file a block.

``DiskTier(directory, max_bytes, queue_bytes)`` keeps blocks as ``<key hex>.safetensors``
files with the arrays ``k.<layer>`` / ``v.<layer>`` and metadata: format version, key,
parent key, token ids, adapter slot, model fingerprint and a checksum of the arrays'
bytes.

Write-behind: the block store hands every new full block to :meth:`DiskTier.write` when
it is made, not when memory evicts it. ``write`` only takes views of the evaluated
arrays' bytes (no copy, no MLX work) into a queue bounded by ``queue_bytes`` (256 MiB by
default) and returns; a background writer thread checksums them and writes the file, so
a long prompt's blocks do not stall the batch's decoding on the engine thread. The
writer never calls MLX (graph evaluation is not safe from two threads): it writes the
safetensors format from the raw bytes itself (any dtype, bfloat16 included), and the
blocks it is done with are dropped on the caller's thread (dropping one may free an MLX
array: a block memory evicted while it was queued). When the queue is full,
``write`` waits for room (back-pressure; nothing is dropped). A server killed with
``kill -9`` (or crashing) loses at most the queued blocks (at most ``queue_bytes``), and a
second server process on the same directory finds a block once it is written.
:meth:`DiskTier.flush` waits until the queue is on disk; :meth:`DiskTier.close` flushes
and ends the writer (the server calls it on shutdown; a process that exits normally also
waits for the writer, which is not a daemon thread). Blocks are immutable, so a block is
written once.

A write goes to a temporary name and is renamed (``os.replace``): a reader never sees
half a file. A writer error (disk full, permission) logs one warning naming the file and
drops that block (it is still in memory: this is a cache). A read verifies everything it
can (metadata, names, shapes, checksum); a corrupt, truncated or foreign file is skipped
with a warning and never served. The directory is bounded by ``max_bytes``: past it the
writer deletes the least recently used files (by modification time; a read refreshes it).
"""

import hashlib
import json
import logging
import os
import struct
import threading
import uuid
from collections import deque

import mlx.core as mx
import numpy as np

log = logging.getLogger("mlx_lm_batched.kv_disk")

FORMAT_VERSION = "1"
SUFFIX = ".safetensors"
DEFAULT_QUEUE_BYTES = 256 << 20

# safetensors' dtype codes of the MLX dtypes a KV block can hold.
SAFETENSORS_DTYPES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16",
                      mx.int8: "I8", mx.uint8: "U8", mx.int16: "I16", mx.uint16: "U16",
                      mx.int32: "I32", mx.uint32: "U32", mx.int64: "I64", mx.uint64: "U64",
                      mx.bool_: "BOOL"}


def bytes_checksum(entries):
    """blake2b hex digest of ``entries``, ``(name, dtype text, shape, raw bytes)`` tuples,
    in name order: the one checksum both the writer thread and the reader compute."""
    h = hashlib.blake2b(digest_size=16)
    for name, dtype, shape, data in sorted(entries, key=lambda e: e[0]):
        h.update(f"{name}:{dtype}:{tuple(shape)};".encode())
        h.update(data)
    return h.hexdigest()


def _raw(x):
    """The row-major bytes of an evaluated MLX array as a flat byte buffer: a view of the
    array's own memory when it is contiguous (no copy), else a copy."""
    view = memoryview(x)
    if view.c_contiguous:
        return view.cast("B")
    return memoryview(np.asarray(x.reshape(-1).view(mx.uint8)))


def _entry(name, x):
    """``(name, dtype text, shape, raw bytes, safetensors dtype)`` of ``x``. The bytes are
    a view that keeps ``x`` alive: whoever drops the entry may free an MLX array, so only
    the caller's thread does (see ``DiskTier._release_written``)."""
    return name, str(x.dtype), tuple(x.shape), _raw(x), SAFETENSORS_DTYPES[x.dtype]


def arrays_checksum(arrays):
    """:func:`bytes_checksum` of ``arrays``, a name -> evaluated MLX array dict."""
    return bytes_checksum([(n, str(x.dtype), tuple(x.shape), _raw(x)) for n, x in arrays.items()])


def save_safetensors(path, entries, metadata):
    """Write ``entries`` (``(name, _, shape, raw bytes, safetensors dtype)``) and the
    string ``metadata`` to ``path`` in the safetensors format, from bytes alone (no MLX)."""
    header, offset = {"__metadata__": metadata}, 0
    for name, _, shape, data, code in entries:
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for entry in entries:
            f.write(entry[3])


class _Pending:
    """One block waiting for the writer: its file, metadata and array entries."""

    __slots__ = ("key", "final", "metadata", "entries", "nbytes")

    def __init__(self, key, final, metadata, entries):
        self.key, self.final, self.metadata, self.entries = key, final, metadata, entries
        self.nbytes = sum(e[3].nbytes for e in entries)


class DiskTier:
    """Blocks as files in ``directory`` (created if missing), at most ``max_bytes``;
    writes go through a background thread with at most ``queue_bytes`` queued."""

    def __init__(self, directory, max_bytes=8 << 30, queue_bytes=DEFAULT_QUEUE_BYTES):
        if max_bytes < 0 or queue_bytes < 1:
            raise ValueError("DiskTier: max_bytes must be >= 0 and queue_bytes >= 1")
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self.queue_bytes = int(queue_bytes)
        self.skipped = 0  # files refused on read (corrupt, truncated, foreign)
        self.write_errors = 0  # blocks the writer could not write (each logged)
        self.files, self.nbytes = self._scan_totals()
        self._queue = deque()  # _Pending blocks, oldest first
        self._queued = {}  # key -> _Pending, queued or being written
        self._queued_bytes = 0  # their bytes (the one being written included)
        self._written = []  # _Pending blocks done with, for the caller's thread to drop
        self._cond = threading.Condition()
        self._writer = None  # the writer thread while it has work

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

    # -- writing (caller side) ----------------------------------------------------
    def write(self, block, adapter, fingerprint):
        """Queue ``block`` (a ``kv_blocks.Block`` of evaluated arrays) for the writer and
        return; waits while the queue holds ``queue_bytes`` (a block larger than that
        is queued alone). The writer skips a block whose file exists."""
        self._release_written()
        if block.key in self._queued:
            return
        entries = []
        for i, (k, v) in enumerate(zip(block.keys, block.values)):
            entries += [_entry(f"k.{i}", k), _entry(f"v.{i}", v)]
        metadata = {"format": FORMAT_VERSION, "key": block.key.hex(), "parent": block.parent.hex(),
                    "tokens": json.dumps(list(block.tokens)), "adapter": str(int(adapter)),
                    "fingerprint": fingerprint.hex(), "layers": str(len(block.keys))}
        item = _Pending(block.key, self.path(block.key), metadata, entries)
        with self._cond:
            while self._queued_bytes and self._queued_bytes + item.nbytes > self.queue_bytes:
                self._cond.wait()
            self._queue.append(item)
            self._queued[item.key] = item
            self._queued_bytes += item.nbytes
            inline = False
            if self._writer is None:
                self._writer = threading.Thread(target=self._drain, name="kv-disk-writer")
                try:
                    self._writer.start()
                except RuntimeError:  # the interpreter is exiting: no new threads
                    self._writer, inline = None, True
        if inline:
            self._drain()

    def flush(self):
        """Wait until every queued block is written (or has failed and been logged)."""
        with self._cond:
            while self._queued_bytes:
                self._cond.wait()
        self._release_written()

    def close(self):
        """Flush and let the writer thread end (a later ``write`` starts another)."""
        self.flush()
        writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join()

    def _release_written(self):
        """Drop the blocks the writer is done with, here: their entries are the last
        references to MLX arrays (an evicted block's), and only this thread frees them."""
        with self._cond:
            written, self._written = self._written, []
        del written

    # -- writing (writer thread) --------------------------------------------------
    def _drain(self):
        """The writer: write queued blocks, oldest first, until the queue is empty."""
        while True:
            with self._cond:
                if not self._queue:
                    self._writer = None
                    self._cond.notify_all()
                    return
                item = self._queue.popleft()
            try:
                self._write_file(item)
            except Exception as e:  # noqa: BLE001  (a cache: never take the engine down)
                self.write_errors += 1
                log.warning("kv disk tier: cannot write %s: %s", item.final, e)
            with self._cond:
                del self._queued[item.key]
                self._queued_bytes -= item.nbytes
                self._written.append(item)  # not dropped here: see _release_written
                self._cond.notify_all()

    def _write_file(self, item):
        if os.path.exists(item.final):
            return
        metadata = dict(item.metadata, checksum=bytes_checksum([e[:4] for e in item.entries]))
        tmp = os.path.join(self.directory, f".{item.key.hex()}.{uuid.uuid4().hex}.tmp{SUFFIX}")
        try:
            save_safetensors(tmp, item.entries, metadata)
            size = os.path.getsize(tmp)
            os.replace(tmp, item.final)
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
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

    # -- reading --------------------------------------------------------------------
    def _skip(self, path, why):
        self.skipped += 1
        log.warning("kv disk tier: skipping %s: %s", path, why)
        return None

    def read(self, key, parent, tokens, adapter, fingerprint, block_size):
        """The block ``key``'s ``(keys, values)`` per-layer lists, or None when it is not
        on disk (a block still queued for the writer is not) or its file does not check
        out (then a warning names the file)."""
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
        """``disk_blocks``, ``disk_bytes``, ``disk_bytes_bound``, ``disk_skipped``,
        ``disk_write_queue_bytes`` (blocks not yet on disk)."""
        self._release_written()
        return {"disk_blocks": self.files, "disk_bytes": self.nbytes,
                "disk_bytes_bound": self.max_bytes, "disk_skipped": self.skipped,
                "disk_write_queue_bytes": self._queued_bytes}
