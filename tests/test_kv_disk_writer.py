"""The disk tier's write-behind writer (``cache/kv_disk.py``) on real SmolLM2 blocks: files
written by the background thread are valid safetensors read back bit for bit by another
process, ``write`` returns before the disk work is done, the queue keeps its byte bound,
a writer error is a warning per file (never an exception), and a server stopped with
SIGTERM has written every queued block."""

import hashlib
import json
import os
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np
import pytest
import torch
from safetensors import safe_open

from conftest import model_dir
from log_records import Records
from server_harness import ServerProcess
from test_kv_blocks import B, generate, smol, text  # noqa: F401  (smol: the fixture)
from mlx_lm_batched.cache.kv_blocks import Block, BlockStore
from mlx_lm_batched.cache.kv_disk import DiskTier
from mlx_lm_batched.sched.block_prefix import model_fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def row(smol):  # noqa: F811
    """A finished row of 5 full blocks and a partial one: (tokens, its cache)."""
    model, ids = smol
    _, _, cache, tokens = generate(model, text(ids, 5 * B + 7, 40), n=2)
    return tokens, cache


@pytest.fixture(scope="module")
def blocks(smol, row):  # noqa: F811
    """The row's 5 real blocks, as a store made them: (fingerprint, [Block])."""
    fp = model_fingerprint(smol[0])
    store = BlockStore(fp, B)
    store.insert(*row)
    return fp, [store._blocks[k] for k in store.chain(row[0])]


def copies(block, n, dtype=None):
    """``n`` blocks holding ``block``'s arrays (cast to ``dtype``) under distinct keys."""
    cast = (lambda x: x) if dtype is None else (lambda x: x.astype(dtype))
    keys, values = [cast(k) for k in block.keys], [cast(v) for v in block.values]
    mx.eval(keys, values)
    return [Block(hashlib.blake2b(f"copy {i}".encode(), digest_size=16).digest(), block.parent,
                  block.tokens, keys, values) for i in range(n)]


def digests(arrays):
    return [hashlib.blake2b(bytes(memoryview(x))).hexdigest() for x in arrays]


READER = """
import json, sys, hashlib
from mlx_lm_batched.cache.kv_disk import DiskTier
spec = json.load(open(sys.argv[1]))
tier, out = DiskTier(spec["dir"]), []
for b in spec["blocks"]:
    got = tier.read(bytes.fromhex(b["key"]), bytes.fromhex(b["parent"]), b["tokens"], 0,
                    bytes.fromhex(spec["fp"]), spec["block_size"])
    out.append(None if got is None else [[str(x.dtype) for x in got[0] + got[1]],
               [hashlib.blake2b(bytes(memoryview(x))).hexdigest() for x in got[0] + got[1]]])
print(json.dumps({"blocks": out, "skipped": tier.skipped}))
"""


def read_in_another_process(tmp_path, directory, fp, blocks):
    spec = {"dir": str(directory), "fp": fp.hex(), "block_size": B,
            "blocks": [{"key": b.key.hex(), "parent": b.parent.hex(), "tokens": list(b.tokens)}
                       for b in blocks]}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    out = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_blocks_written_behind_are_read_back_bit_identical_by_another_process(tmp_path, smol, row):  # noqa: F811
    fp = model_fingerprint(smol[0])
    store = BlockStore(fp, B, disk=DiskTier(tmp_path / "kv"))
    assert store.insert(*row) == 5
    store.disk.flush()
    assert store.disk.stats()["disk_write_queue_bytes"] == 0 and store.disk.files == 5
    held = [store._blocks[k] for k in store.chain(row[0])]
    got = read_in_another_process(tmp_path, tmp_path / "kv", fp, held)
    assert got["skipped"] == 0
    for block, (dtypes, digest) in zip(held, got["blocks"]):
        assert dtypes == [str(x.dtype) for x in block.keys + block.values]
        assert digest == digests(block.keys + block.values)
    # The files are plain safetensors: the safetensors package reads the same arrays.
    with safe_open(store.disk.path(held[2].key), framework="numpy") as f:
        assert f.metadata()["key"] == held[2].key.hex() and "checksum" in f.metadata()
        for i, (k, v) in enumerate(zip(held[2].keys, held[2].values)):
            assert np.array_equal(f.get_tensor(f"k.{i}"), np.asarray(k))
            assert np.array_equal(f.get_tensor(f"v.{i}"), np.asarray(v))


def test_bfloat16_blocks_round_trip(tmp_path, blocks):
    fp, held = blocks
    block = copies(held[0], 1, mx.bfloat16)[0]
    tier = DiskTier(tmp_path)
    tier.write(block, 0, fp)
    tier.close()
    keys, values = DiskTier(tmp_path).read(block.key, block.parent, block.tokens, 0, fp, B)
    for got, want in zip(keys + values, block.keys + block.values):
        assert got.dtype == mx.bfloat16 and mx.array_equal(got, want)
    with safe_open(tier.path(block.key), framework="pt") as f:
        t = f.get_tensor("k.0")
        assert t.dtype == torch.bfloat16
        assert t.view(torch.int16).numpy().tobytes() == bytes(memoryview(block.keys[0]))


def test_write_returns_before_the_blocks_are_on_disk(tmp_path, blocks):
    fp, held = blocks
    many = copies(held[0], 48)
    tier = DiskTier(tmp_path)
    start, start_cpu = time.perf_counter(), time.thread_time()
    for block in many:
        tier.write(block, 0, fp)
    queued_cpu = time.thread_time() - start_cpu
    behind = tier.stats()["disk_write_queue_bytes"]
    tier.flush()
    done = time.perf_counter()
    assert behind > 0  # still being written when ``write`` had returned
    assert tier.stats()["disk_write_queue_bytes"] == 0 and tier.files == len(many)
    assert len(os.listdir(tmp_path)) == len(many)
    # Queuing copies bytes; the writer checksums and writes them. The caller's own CPU
    # time: on a busy machine its wall time also counts the time it waited for a core.
    assert queued_cpu < 0.5 * (done - start), (queued_cpu, done - start)


def test_back_pressure_bounds_the_queue_and_drops_nothing(tmp_path, blocks):
    fp, held = blocks
    size = held[0].nbytes
    many = copies(held[0], 12)
    tier = DiskTier(tmp_path / "bounded", queue_bytes=2 * size)
    seen = []
    for block in many:
        tier.write(block, 0, fp)
        seen.append(tier.stats()["disk_write_queue_bytes"])
    assert max(seen) <= 2 * size and max(seen) > 0
    tier.close()
    assert tier.files == len(many) and len(os.listdir(tmp_path / "bounded")) == len(many)
    # A bound smaller than one block: each block is queued alone, none is refused.
    tiny = DiskTier(tmp_path / "tiny", queue_bytes=1)
    for block in many[:3]:
        tiny.write(block, 0, fp)
        assert tiny.stats()["disk_write_queue_bytes"] <= size
    tiny.close()
    assert tiny.files == 3


def test_a_writer_error_is_a_warning_per_file(tmp_path, smol, row):  # noqa: F811
    fp = model_fingerprint(smol[0])
    directory = tmp_path / "kv"
    store = BlockStore(fp, B, disk=DiskTier(directory))
    os.rmdir(directory)
    directory.write_text("not a directory")  # every write now fails (NotADirectoryError)
    with Records("mlx_lm_batched.kv_disk") as log:
        assert store.insert(*row) == 5  # the blocks are in memory all the same
        store.disk.flush()
    failed = [r.getMessage() for r in log.records if "cannot write" in r.getMessage()]
    want = {store.disk.path(k) for k in store.chain(row[0])}
    assert len(failed) == 5 and {m.split("cannot write ")[1].split(":")[0] for m in failed} == want
    assert store.disk.write_errors == 5 and store.disk.stats()["disk_write_queue_bytes"] == 0
    assert store.lookup(row[0]).memory_tokens == 5 * B


def test_a_stopped_server_has_written_every_block(tmp_path, smol):  # noqa: F811
    _, ids = smol
    disk = tmp_path / "kv"
    server = ServerProcess(model_dir("smollm2", dtype="float32"), "--served-model-name", "m",
                           "--kv-disk-dir", disk)
    try:
        status, body, _ = server.request("POST", "/v1/completions", {
            "model": "m", "prompt": text(ids, 20 * B, 5), "max_tokens": 4, "temperature": 0})
        assert status == 200, body
        assert "mlx_lm_batched_kv_blocks_disk_write_queue_bytes" in server.metrics()
    finally:
        assert server.stop() == 0  # SIGTERM: the engine stops, the writer flushes
    names = [n for n in os.listdir(disk) if n.endswith(".safetensors")]
    assert len(names) >= 20 and not any(n.startswith(".") for n in names)
    assert "cannot write" not in server.output()
