"""Run ``python -m mlx_lm_batched.server`` as a real subprocess on a free local port."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

START_TIMEOUT_S = 180


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server subprocess: ``url``, ``get``/``post`` helpers, ``stop()`` -> exit status."""

    def __init__(self, model_dir, *args, env=None, launcher=()):
        """``launcher``: words before the Python command (``mlx.launch ... --``)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [*launcher, sys.executable, "-m", "mlx_lm_batched.server", "--model", str(model_dir),
               "--port", str(self.port), "--log-level", "warning", *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        raise RuntimeError(f"server did not answer /health in {START_TIMEOUT_S} s:\n{self.output()}")

    def output(self):
        if not self.log.closed:  # stop() closes it; the file is still there to read
            self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-5000:]

    def request(self, method, path, body=None, headers=None, timeout=120):
        """``(status, parsed JSON or text, lower-cased headers)``; ``body`` bytes are sent as they are."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw, hdrs = r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            status, raw, hdrs = e.code, e.read(), e.headers
        hdrs = {k.lower(): v for k, v in hdrs.items()}
        try:
            return status, json.loads(raw), hdrs
        except ValueError:
            return status, raw.decode("utf-8", "replace"), hdrs

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self, headers=None):
        from mlx_lm_batched.server.metrics import parse_metrics

        status, text, _ = self.get("/metrics", headers=headers)
        assert status == 200, text
        return parse_metrics(text)

    def metrics_when_idle(self, timeout=15, headers=None):
        """``/metrics`` once no row runs or waits and no KV is reserved (or after
        ``timeout`` s: the caller's assertions then say what was left). The engine updates
        its gauges after the step in which the last answer was sent, so a client that has
        its answer may read them a moment before."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics(headers)
            busy = (m["mlx_lm_batched_running_rows"] or m["mlx_lm_batched_waiting_rows"]
                    or m["mlx_lm_batched_kv_reserved_bytes"])
            if not busy or time.monotonic() > deadline:
                return m
            time.sleep(0.1)

    def stop(self, timeout=60):
        """SIGTERM, then wait; returns the exit status (kills after ``timeout`` s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
