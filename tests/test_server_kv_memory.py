"""The server's KV memory bound: on by default (sized from the memory free after
loading), given in GB or as a share; requests beyond it wait their turn and finish with
the tokens they get alone, none answered 429 or 5xx; bad settings end in one line."""

import concurrent.futures as futures
import re
import subprocess
import sys

import pytest

from mlx_lm_batched.engine.kv_budget import (
    DEFAULT_MARGIN_BYTES,
    DEFAULT_PREFIX_CACHE_BYTES,
    kv_memory_budget,
    split_kv_bound,
)
from server_harness import ServerProcess
from test_server_errors import kv_bytes_per_token


def test_budget_settings():
    gb = 10 ** 9
    assert kv_memory_budget("2", 20 * gb) == 2 * gb
    assert kv_memory_budget("0.5", None) == gb // 2
    assert kv_memory_budget("25%", 20 * gb) == 5 * gb
    # Default: what is free less what the prefix cache may hold and 10% (>= 1 GiB).
    assert kv_memory_budget(None, 20 * gb, held_elsewhere=gb) == 20 * gb - gb - 2 * gb
    assert kv_memory_budget(None, 3 * gb) == 3 * gb - DEFAULT_MARGIN_BYTES
    assert kv_memory_budget(None, gb // 2) == 0
    assert kv_memory_budget(None, None) is None
    for bad in ("0", "-1", "lots", "150%", "0%"):
        with pytest.raises(ValueError, match="--kv-memory must be"):
            kv_memory_budget(bad, 20 * gb)
    with pytest.raises(ValueError, match="give it in GB"):
        kv_memory_budget("50%", None)


def test_an_explicit_bound_covers_the_prefix_cache():
    gb = 10 ** 9
    # A quarter for the prefix cache's blocks (at most its default 1 GiB), the rest admits.
    assert split_kv_bound(gb // 2) == (gb // 2 - gb // 8, gb // 8)
    assert split_kv_bound(20 * gb) == (20 * gb - DEFAULT_PREFIX_CACHE_BYTES,
                                       DEFAULT_PREFIX_CACHE_BYTES)
    # Its bound given: the two are separate, as given; prefix reuse off: all admits.
    assert split_kv_bound(gb, prefix_cache_bytes=gb // 10) == (gb, gb // 10)
    assert split_kv_bound(gb, prefix_cache_on=False)[0] == gb


@pytest.mark.parametrize("flags,budget,prefix", [
    (["--kv-memory", "0.4"], 300_000_000, 100_000_000),
    (["--kv-memory", "0.4", "--prompt-cache-bytes", "50000000"], 400_000_000, 50_000_000),
])
def test_kv_memory_bounds_requests_and_prefix_blocks(float_dirs, flags, budget, prefix):
    """The server's gauges and startup log show the split of ``--kv-memory``."""
    srv = ServerProcess(float_dirs["smollm2"], *flags, "--log-level", "info")
    try:
        metrics = srv.metrics()
        assert metrics["mlx_lm_batched_kv_budget_bytes"] == budget
        assert metrics["mlx_lm_batched_kv_blocks_bytes_bound"] == prefix
        assert f"KV memory: {budget / 1e9:.2f} GB; prefix cache: {prefix / 1e9:.2f} GB" \
            in srv.output(), srv.output()
    finally:
        assert srv.stop() == 0, srv.output()


@pytest.mark.parametrize("flags,message", [
    (["--kv-memory", "lots"], "--kv-memory must be a number of GB"),
    (["--kv-memory", "1", "--max-kv-bytes", "1000"], "set the same bound: pass one"),
])
def test_bad_settings_end_in_one_line(float_dirs, flags, message):
    out = subprocess.run([sys.executable, "-m", "mlx_lm_batched.server", "--model",
                          str(float_dirs["smollm2"]), *flags], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_default_bound_is_on(float_dirs):
    srv = ServerProcess(float_dirs["smollm2"], "--log-level", "info")
    try:
        budget = srv.metrics()["mlx_lm_batched_kv_budget_bytes"]
        # A bound, sized from the memory free at startup (on a machine that busy tests
        # share it can be small, even 0: then every request is a 400 naming it).
        match = re.search(r"KV memory: ([0-9.]+) GB", srv.output())
        assert match is not None, srv.output()
        assert abs(budget / 1e9 - float(match.group(1))) <= 0.005, (budget, srv.output())
    finally:
        assert srv.stop() == 0, srv.output()


def test_requests_beyond_the_bound_wait_and_equal_alone(float_dirs):
    """Room for two requests at a time, eight at once: every one is 200 with the tokens
    it gets alone (greedy), none 429; the memory waits show in /metrics."""
    d = float_dirs["smollm2"]
    prompts = [f"Write a short line about the number {i}:" for i in range(8)]
    body = lambda p: {"prompt": p, "max_tokens": 24, "temperature": 0}
    per_request = kv_bytes_per_token(d) * (32 + 24)  # prompts are under 32 tokens
    srv = ServerProcess(d, "--max-kv-bytes", 2 * per_request + per_request // 2,
                        "--prompt-cache-size", 0)
    try:
        alone = []
        for p in prompts:
            code, out, _ = srv.post("/v1/completions", body(p))
            assert code == 200, out
            alone.append(out["choices"][0]["text"])
        with futures.ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(lambda p: srv.post("/v1/completions", body(p)), prompts))
        assert [code for code, _, _ in results] == [200] * len(prompts), results
        assert [out["choices"][0]["text"] for _, out, _ in results] == alone
        metrics = srv.metrics_when_idle()
        assert metrics["mlx_lm_batched_kv_reserved_bytes"] == 0
        statuses = {k: v for k, v in metrics.items() if k.startswith("mlx_lm_batched_requests_total")}
        assert all('status="200"' in k for k in statuses), statuses
    finally:
        assert srv.stop() == 0, srv.output()
