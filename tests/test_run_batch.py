"""``python -m mlx_lm_batched.run_batch`` killed with SIGKILL mid-run and resumed: every
line of the OpenAI Batch file ends up in the output exactly once."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from conftest import model_dir

N = 20  # lines, two of them bad


def write_requests(path):
    lines = []
    for i in range(N - 2):
        if i % 2:
            lines.append({"custom_id": f"text-{i}", "method": "POST", "url": "/v1/completions",
                          "body": {"prompt": f"Fact number {i}:", "max_tokens": 6}})
        else:
            lines.append({"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"messages": [{"role": "user", "content": f"Say {i}."}],
                                   "max_tokens": 6, "stop": ["\n\n"]}})
    text = [json.dumps(x) for x in lines]
    text.insert(3, '{"custom_id": "broken", "url": ')  # line 4: not JSON
    text.insert(7, json.dumps({"custom_id": "odd", "url": "/v1/completions",
                               "body": {"prompt": "x", "logprobs": 2}}))  # line 8
    path.write_text("\n".join(text) + "\n")


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.slow
def test_run_batch_resumes_after_sigkill_with_every_line_once(tmp_path):
    smol = str(model_dir("smollm2", dtype="float32"))
    requests, results = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    write_requests(requests)
    cmd = [sys.executable, "-m", "mlx_lm_batched.run_batch", "-i", str(requests), "-o",
           str(results), "--model", smol, "--batch-size", "2", "--no-progress"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (results.exists() and results.read_bytes().count(b"\n") >= 6):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    before = records(results) if results.read_bytes().endswith(b"\n") else None
    with open(results, "ab") as f:  # as if killed in the middle of writing a record
        f.write(b'{"id": "batch_req_')
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = records(results)
    counts = Counter(r["id"] for r in out)
    assert set(counts) == {f"batch_req_{n}" for n in range(1, N + 1)}
    assert max(counts.values()) == 1 and len(out) == N
    if before is not None:
        assert 6 <= len(before) < N and out[:len(before)] == before  # kept, not redone
    by_id = {r["id"]: r for r in out}
    assert by_id["batch_req_4"]["error"]["code"] == "invalid_json"
    assert by_id["batch_req_8"]["error"] == {
        "code": "unsupported_field", "message": "'logprobs' is not supported by run_batch"}
    assert by_id["batch_req_8"]["custom_id"] == "odd"
    good = [r for r in out if r["error"] is None]
    assert len(good) == N - 2
    for r in good:
        body = r["response"]["body"]
        assert r["response"]["status_code"] == 200
        assert body["usage"]["completion_tokens"] <= 6
        choice = body["choices"][0]
        if r["custom_id"].startswith("chat"):
            assert body["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
            assert "\n\n" not in (choice["message"]["content"] or "")
        else:
            assert body["object"] == "text_completion" and choice["text"]
    # A third run finds nothing left to do.
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already in" in again.stderr
    assert records(results) == out


def test_bad_lines_are_named_one_by_one():
    from mlx_lm_batched.cli.batch_lines import LineError, parse_line

    def check(line, code, fragment):
        try:
            parse_line(json.dumps(line), tokenizer=None, context=64, default_max_tokens=8,
                       vocab_size=100)
        except LineError as e:
            assert e.code == code and fragment in str(e), (e.code, str(e))
            assert e.custom_id == line.get("custom_id")
        else:
            raise AssertionError(f"accepted {line}")

    text = {"custom_id": "a", "url": "/v1/completions"}
    check({**text, "body": {"prompt": [1, 200]}}, "invalid_value", "token id 200 is outside")
    check({**text, "body": {"prompt": [1] * 64}}, "context_length_exceeded", "64 tokens")
    check({**text, "body": {"prompt": [1], "temperature": 3}}, "invalid_value", "'temperature'")
    check({**text, "body": {"prompt": [1], "n": 2}}, "unsupported_value", "'n' must be 1")
    check({**text, "url": "/v1/embeddings", "body": {}}, "invalid_url", "'url' must be one of")
    check({"custom_id": "c", "url": "/v1/chat/completions",
           "body": {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}},
          "unsupported_value", "constrained decoding")
    _, req = parse_line(json.dumps({**text, "body": {"prompt": [5, 6], "max_tokens": 100,
                                                       "stop": "x", "seed": 3}}), None, 64, 8, 100)
    assert (req.tokens, req.max_tokens, req.stop, req.seed) == ([5, 6], 62, ["x"], 3)
