"""What the serving benchmarks share: our server as a subprocess, its memory, streamed requests.

Used by ``bench_conversations.py``, ``bench_kv_bound.py`` and ``bench_kv_restart.py`` (run
from ``scripts/``: the scripts' own directory is first on ``sys.path``). The server is
``python -m mlx_lm_batched.server`` from whatever ``PYTHONPATH`` imports, started from a
neutral working directory so that ``-m`` does not put the caller's directory first.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "corpus.txt"
START_TIMEOUT_S = 300


def free_port():
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    """Resident memory of process ``pid`` (``VmRSS`` of ``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS(threading.Thread):
    """Samples a process's RSS until stopped; ``peak`` holds the largest seen."""

    def __init__(self, pid, every=0.02):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak, self._done = pid, every, 0, threading.Event()

    def run(self):
        while not self._done.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except OSError:
                return
            time.sleep(self.every)

    def stop(self):
        self._done.set()
        self.join()


def start_server(model_dir, port, extra=(), log=None):
    """Start our server on ``port`` with flags ``extra``; the process once ``/health`` answers.

    ``log``: a file path for the server's output (default ``$BENCH_SERVER_LOG``, else
    discarded); appended to, so that a restarted server's lines follow the first one's."""
    cmd = [sys.executable, "-m", "mlx_lm_batched.server", "--model", str(model_dir),
           "--served-model-name", "m", "--port", str(port), "--log-level", "warning", *extra]
    out = open(log or os.environ.get("BENCH_SERVER_LOG", os.devnull), "a")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    out.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"server did not start in {START_TIMEOUT_S} s")


def stop_server(proc):
    """SIGTERM, then SIGKILL if it has not exited within a minute."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def metrics(port):
    """The server's ``/metrics`` as ``{name: value}`` (unlabelled samples only)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^([a-zA-Z_:][\w:]*) ([-+.\deE]+|NaN)$", text, re.M)}


def machine():
    """CPU model, BLAS and load average: what a figure from these scripts depends on."""
    from mlx_lm_batched import _blas

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                if line.startswith("Model name")), "unknown")
    return {"cpu": cpu, "cores": os.cpu_count(), "blas": _blas.describe(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "pythonpath": os.environ.get("PYTHONPATH")}


def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def corpus_ids(tok):
    """The corpus's token ids (no special tokens)."""
    return tok.encode(CORPUS.read_text(encoding="utf-8"), add_special_tokens=False)


def corpus_text(tok, n_tokens):
    """Corpus text (repeated) cut to about ``n_tokens`` tokens of ``tok``."""
    ids = corpus_ids(tok)
    return tok.decode((ids * (n_tokens // len(ids) + 1))[:n_tokens])


def distinct_prompts(tok, count, n_tokens):
    """``count`` token prompts of exactly ``n_tokens``, each the corpus (as a cycle of
    tokens) read from its own start: no two share their first tokens, so no two share a
    cached KV block. Fails if the corpus has fewer tokens than ``count``."""
    ids = corpus_ids(tok)
    if count > len(ids):
        raise SystemExit(f"{count} distinct prompts need a corpus of at least {count} tokens "
                         f"(it has {len(ids)})")
    cycle = ids * (n_tokens // len(ids) + 2)
    stride = len(ids) / count  # starts spread over the whole corpus
    return [cycle[int(i * stride):int(i * stride) + n_tokens] for i in range(count)]


def _cached(usage):
    details = getattr(usage, "prompt_tokens_details", None)
    return (getattr(details, "cached_tokens", 0) or 0) if details else 0


def stream_chat(client, messages, max_tokens):
    """``(answer, ttft s, prompt tokens, cached tokens)`` of one streamed greedy chat turn."""
    sent = time.monotonic()
    ttft, parts, usage = None, [], None
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                if ttft is None:
                    ttft = time.monotonic() - sent
                parts.append(choice.delta.content)
    return "".join(parts), ttft if ttft is not None else time.monotonic() - sent, \
        usage.prompt_tokens, _cached(usage)


def stream_completion(client, prompt, max_tokens, stop=None):
    """One streamed greedy ``/v1/completions`` request on a token-id prompt (ending at a
    ``stop`` string, if given): a dict of its status (200, or the error's status),
    generated tokens (``logprobs``' token strings), text, times (sent, first token and end,
    monotonic) and usage. A request the client gave up on has status ``"timeout"`` (or
    ``"connection"``), recorded like an error status rather than ending the run."""
    import openai

    sent = time.monotonic()
    out = {"status": 200, "sent": sent, "first": None, "tokens": [], "text": ""}
    try:
        stream = client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, logprobs=0, stream=True, stop=stop,
                                           stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                out["prompt_tokens"] = chunk.usage.prompt_tokens
                out["completion_tokens"] = chunk.usage.completion_tokens
                out["cached_tokens"] = _cached(chunk.usage)
            for choice in chunk.choices:
                if choice.logprobs is not None and choice.logprobs.tokens:
                    if out["first"] is None:
                        out["first"] = time.monotonic()
                    out["tokens"] += choice.logprobs.tokens
                out["text"] += choice.text or ""
    except openai.APIStatusError as e:
        out.update(status=e.status_code, error=str(e)[:300])
    except openai.APIConnectionError as e:  # the client gave up (its timeout) or lost the server
        out.update(status="timeout" if isinstance(e, openai.APITimeoutError) else "connection",
                   error=str(e)[:300])
    out["end"] = time.monotonic()
    return out


def pct(values, q):
    """The ``q`` quantile of ``values`` (nearest rank)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]
