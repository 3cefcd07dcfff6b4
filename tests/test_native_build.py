"""The native kernels' build cache: a build is done once per key, and a failed build is
remembered under the same key, so an import does not pay for the same failing compile
again; a changed source is a new key and builds again."""

import os
import stat

import pytest

from mlx_lm_batched import _native_build


def fake_compiler(tmp_path):
    """A compiler that counts its runs and fails on sources containing 'broken'."""
    script = tmp_path / "fake-cc"
    script.write_text("#!/bin/sh\n"
                      f"echo run >> {tmp_path}/runs\n"
                      'if grep -q broken "$1"; then echo "x.c:1: error: broken" >&2; exit 1; fi\n'
                      'for a; do last="$a"; done; echo built > "$last"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def runs(tmp_path):
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_failed_build_is_remembered_until_the_source_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cc = fake_compiler(tmp_path)
    source = tmp_path / "kernel.c"
    source.write_text("broken\n")
    for _ in range(2):
        with pytest.raises(OSError, match="building the test kernel failed: x.c:1: error: broken"):
            _native_build.cached_build("k", "test kernel", cc, [str(source)], ["-O2"])
    assert runs(tmp_path) == 1  # the second call read the remembered failure
    source.write_text("fixed\n")
    path = _native_build.cached_build("k", "test kernel", cc, [str(source)], ["-O2"])
    assert open(path).read() == "built\n" and runs(tmp_path) == 2
    assert _native_build.cached_build("k", "test kernel", cc, [str(source)], ["-O2"]) == path
    assert runs(tmp_path) == 2
    assert os.path.dirname(path) == str(tmp_path / "cache" / "mlx_lm_batched" / "native")
