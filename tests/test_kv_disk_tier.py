"""The KV blocks' disk tier (``cache/kv_disk.py``): blocks written behind as safetensors
files are found by a fresh store, a restarted server (after ``kill -9``) and a second
server process; corrupt, truncated and foreign files are skipped with a warning."""

import os
import time

import mlx.core as mx
import pytest
from openai import OpenAI

from conftest import model_dir
from log_records import Records
from server_harness import ServerProcess
from test_kv_blocks import B, generate, smol, text  # noqa: F401  (smol: the fixture)
from mlx_lm_batched.cache.kv_blocks import BlockStore
from mlx_lm_batched.cache.kv_disk import DiskTier
from mlx_lm_batched.sched.block_prefix import model_fingerprint


@pytest.fixture(scope="module")
def row(smol):  # noqa: F811
    """A finished row of 5 full blocks and a partial one: (tokens, its cache)."""
    model, ids = smol
    _, _, cache, tokens = generate(model, text(ids, 5 * B + 7, 40), n=2)
    return tokens, cache


def stored(tmp_path, smol, row, max_bytes=1 << 30):  # noqa: F811
    model, _ = smol
    fp = model_fingerprint(model)
    store = BlockStore(fp, B, disk=DiskTier(tmp_path, max_bytes))
    store.insert(*row)
    store.disk.flush()  # written behind: on disk once flushed
    return fp, store


def test_a_fresh_store_reads_the_blocks_back_exactly(tmp_path, smol, row):  # noqa: F811
    fp, first = stored(tmp_path, smol, row)
    tokens = row[0]
    assert first.disk.files == 6 - 1 and len(os.listdir(tmp_path)) == 5  # full blocks only
    fresh = BlockStore(fp, B, disk=DiskTier(tmp_path))
    assert fresh.disk.files == 5
    hit = fresh.lookup(tokens)
    assert hit.disk_tokens == 5 * B and hit.memory_tokens == 0
    want = first.lookup(tokens)
    for got, ref in zip(hit.cache, want.cache):
        assert mx.array_equal(got.state[0], ref.state[0]) and mx.array_equal(got.state[1], ref.state[1])
    fresh.release(hit.keys)
    again = fresh.lookup(tokens)  # now in memory
    assert again.memory_tokens == 5 * B and again.disk_tokens == 0


def test_corrupt_truncated_and_foreign_files_are_skipped(tmp_path, smol, row):  # noqa: F811
    fp, first = stored(tmp_path, smol, row)
    tokens = row[0]
    keys = first.chain(tokens)
    paths = [first.disk.path(k) for k in keys]
    with open(paths[3], "r+b") as f:  # truncated
        f.truncate(os.path.getsize(paths[3]) // 2)
    with open(paths[1], "r+b") as f:  # a flipped byte in the arrays (the header intact)
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with Records("mlx_lm_batched.kv_disk") as log:
        hit = BlockStore(fp, B, disk=DiskTier(tmp_path)).lookup(tokens)
    assert hit.disk_tokens == 1 * B  # block 0 only: block 1 is corrupt, the chain stops
    assert any(paths[1] in r.getMessage() and "checksum" in r.getMessage() for r in log.records)
    # Block 0 read, block 2's file put under block 1's name: its metadata does not match.
    os.replace(paths[2], paths[1])
    store = BlockStore(fp, B, disk=DiskTier(tmp_path))
    with Records("mlx_lm_batched.kv_disk") as log:
        assert store.lookup(tokens).disk_tokens == 1 * B
    assert any(paths[1] in r.getMessage() and "metadata" in r.getMessage() for r in log.records)
    assert store.disk.skipped == 1
    # Another model (another fingerprint) finds nothing of this one.
    assert BlockStore(b"another model", B, disk=DiskTier(tmp_path)).lookup(tokens).cache is None
    # A truncated file alone: unreadable, skipped.
    os.replace(paths[3], paths[0])
    with Records("mlx_lm_batched.kv_disk") as log:
        assert BlockStore(fp, B, disk=DiskTier(tmp_path)).lookup(tokens).cache is None
    assert any(paths[0] in r.getMessage() for r in log.records)


def test_the_directory_keeps_its_bound(tmp_path, smol, row):  # noqa: F811
    fp, probe = stored(tmp_path / "probe", smol, row)
    size = os.path.getsize(probe.disk.path(probe.chain(row[0])[0]))
    _, store = stored(tmp_path / "bounded", smol, row, max_bytes=3 * size)
    assert store.disk.files <= 3 and store.disk.nbytes <= 3 * size
    assert len(os.listdir(tmp_path / "bounded")) == store.disk.files


def complete(server, prompt):
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    out = client.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0)
    return out.choices[0].text, out.usage.prompt_tokens_details.cached_tokens


def blocks_on_disk(server, at_least, timeout=30):
    """The server's ``kv_blocks_on_disk`` gauge once it reaches ``at_least`` (blocks are
    written behind, and the gauge is refreshed by the engine loop), or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        n = server.metrics()["mlx_lm_batched_kv_blocks_on_disk"]
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def test_a_restarted_server_and_a_second_process_reuse_the_blocks(tmp_path, smol):  # noqa: F811
    model, ids = smol
    path = model_dir("smollm2", dtype="float32")
    disk = tmp_path / "kv"
    one, two = text(ids, 300, 10), text(ids, 300, 400)
    reusable = (300 - 1) // B * B
    first = ServerProcess(path, "--served-model-name", "m", "--kv-disk-dir", disk)
    try:
        want_one, cached = complete(first, one)
        assert cached == 0
        assert blocks_on_disk(first, 300 // B) >= 300 // B
    finally:
        first.proc.kill()  # kill -9: nothing is flushed on the way out
        first.proc.wait()
        first.log.close()
    restarted = ServerProcess(path, "--served-model-name", "m", "--kv-disk-dir", disk)
    second = None
    try:
        got, cached = complete(restarted, one)
        assert (got, cached) == (want_one, reusable)
        m = restarted.metrics()
        assert m['mlx_lm_batched_prefix_hit_tokens_total{source="disk"}'] == reusable
        want_two, _ = complete(restarted, two)
        assert blocks_on_disk(restarted, 2 * (300 // B)) >= 2 * (300 // B)
        second = ServerProcess(path, "--served-model-name", "m", "--kv-disk-dir", disk)
        assert complete(second, two) == (want_two, reusable)  # written by the other process
        # A truncated block: the second server (which never held ``one`` in memory)
        # skips it with a warning and computes the rest; the answer is the same.
        fp = model_fingerprint(model)
        key = BlockStore(fp, B).chain(one)[3]
        victim = DiskTier(disk).path(key)
        with open(victim, "r+b") as f:
            f.truncate(100)
        assert complete(second, one) == (want_one, 3 * B)
        assert "skipping" in second.output() and os.path.basename(victim) in second.output()
    finally:
        for s in (restarted, second):
            if s is not None:
                assert s.stop() == 0
