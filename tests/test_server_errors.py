"""Bad input, access control and limits: 4xx with OpenAI's error JSON, the server
unharmed (``/health`` answers after each), and SIGTERM draining a stream and exiting 0."""

import concurrent.futures as futures
import json
import threading
import time

import httpx
import pytest

from server_harness import ServerProcess

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "Hi"}]


def kv_bytes_per_token(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2 * 4  # K and V, float32


@pytest.fixture(scope="module")
def server(float_dirs):
    d = float_dirs["smollm2"]
    srv = ServerProcess(d, "--max-body-bytes", 200_000, "--max-tokens-limit", 256, "--max-n", 4,
                        "--max-kv-bytes", kv_bytes_per_token(d) * 300, "--max-batch", 8,
                        env={"MLX_LM_BATCHED_API_KEY": KEY})
    yield srv
    srv.stop()


def post(server, path, body, headers=AUTH):
    return server.post(path, body, headers=headers)


def assert_error(server, status, got, param=None):
    code, body, _ = got
    assert code == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    assert server.get("/health")[0] == 200


@pytest.mark.parametrize("body,param", [
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": MSG, "max_tokens": -3}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 2.5}, "max_tokens"),
    ({"messages": MSG, "temperature": -0.5}, "temperature"),
    ({"messages": MSG, "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": MSG, "top_p": 1.5}, "top_p"),
    ({"messages": MSG, "stream": "yes"}, "stream"),
    ({"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"999999": 1}}, "logit_bias"),
    ({"messages": MSG, "max_tokens": 1000}, "max_tokens"),  # over --max-tokens-limit
    ({"messages": MSG, "n": 5}, "n"),  # over --max-n
    ({}, "messages"),
])
def test_chat_bad_fields(server, body, param):
    assert_error(server, 400, post(server, "/v1/chat/completions", body), param)


@pytest.mark.parametrize("body,param", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": [49152000]}, "prompt"),  # outside the vocabulary
    ({"prompt": "hi", "logprobs": 50}, "logprobs"),
    ({"prompt": [17] * 8200}, "prompt"),  # over the 8192-token context
    ({"prompt": [17] * 8000, "max_tokens": 250}, "max_tokens"),  # prompt + max_tokens over it
])
def test_completion_bad_fields(server, body, param):
    assert_error(server, 400, post(server, "/v1/completions", body), param)


def test_malformed_body(server):
    assert_error(server, 400, post(server, "/v1/chat/completions", b'{"messages": [', AUTH))
    assert_error(server, 400, post(server, "/v1/chat/completions", b'\xff\xfe{"messages": []}', AUTH))
    assert_error(server, 400, post(server, "/v1/completions", b'["a list"]', AUTH))
    code, body, _ = post(server, "/v1/chat/completions", b'{"messages": [', AUTH)
    assert body["error"]["code"] == "invalid_json"


def test_failing_request_fails_alone(server):
    """A prompt the tokenizer cannot encode (a lone surrogate) fails with 400 while a
    stream running next to it ends whole."""
    body = {"prompt": "Once upon a time", "max_tokens": 16, "stream": True}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            bad = post(server, "/v1/completions", b'{"prompt": "\\ud800 broken", "max_tokens": 4}')
            assert_error(server, 400, bad, None)
            rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][5:])["choices"][0]["finish_reason"] == "length"


def test_unknown_model_and_route(server):
    assert_error(server, 404, post(server, "/v1/chat/completions", {"model": "gpt-9", "messages": MSG}),
                 "model")
    assert_error(server, 404, server.get("/v1/nothing", headers=AUTH))


def test_api_key(server):
    body = {"messages": MSG, "max_tokens": 2}
    assert_error(server, 401, post(server, "/v1/chat/completions", body, headers={}))
    assert_error(server, 401, post(server, "/v1/chat/completions", body,
                                   headers={"Authorization": "Bearer wrong"}))
    assert_error(server, 401, server.get("/v1/models"))
    assert_error(server, 401, server.get("/metrics"))
    assert server.get("/health")[0] == 200  # open: load balancers probe it
    code, out, _ = post(server, "/v1/chat/completions", body)
    assert code == 200 and out["choices"][0]["message"]["content"]
    assert server.get("/v1/models", headers=AUTH)[0] == 200
    counts = server.metrics(AUTH)
    assert counts['mlx_lm_batched_requests_total{endpoint="/v1/chat/completions",status="401"}'] >= 2


def test_body_over_limit(server):
    big = {"prompt": "word " * 60_000, "max_tokens": 1}
    assert_error(server, 413, post(server, "/v1/completions", big))


def test_kv_admission(server):
    """A request that can never fit is 400 naming the limit; one that does not fit next
    to a running one waits (never 429) and starts once that one is gone."""
    code, err, _ = post(server, "/v1/completions", {"prompt": [17] * 100, "max_tokens": 250})
    assert_error(server, 400, (code, err, _), "max_tokens")
    assert "--kv-memory" in err["error"]["message"]
    body = {"prompt": "Count from one to one hundred:", "max_tokens": 200, "stream": True,
            "logit_bias": {"2": -100}}  # no EOS: the first request stays running
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as http:
        with http.stream("POST", "/v1/completions", json=body) as first:
            assert first.status_code == 200
            lines = first.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            with futures.ThreadPoolExecutor(1) as pool:
                # 100 more tokens do not fit beside the first's 200 (room for 225: of the
                # 300 tokens' bound, the prefix cache's blocks take a quarter).
                second = pool.submit(post, server, "/v1/completions",
                                     {**body, "stream": False, "max_tokens": 100})
                deadline = time.monotonic() + 30
                while server.metrics(AUTH)["mlx_lm_batched_kv_waiting_requests"] < 1:
                    assert time.monotonic() < deadline, server.output()
                    assert not second.done(), second.result()
                    time.sleep(0.1)
                first.close()  # the running stream goes: its memory starts the second
                code, out, _ = second.result(timeout=60)
    assert code == 200 and out["usage"]["completion_tokens"] == 100
    metrics = server.metrics_when_idle(30, AUTH)
    assert metrics["mlx_lm_batched_kv_reserved_bytes"] == 0
    assert metrics["mlx_lm_batched_kv_waiting_requests"] == 0


def test_waiting_requests_limit(float_dirs):
    """One row at a time and one waiting request: a third request gets 429 with
    Retry-After; the waiting one is served once the running one is gone."""
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 1, "--prefill-batch", 1,
                        "--max-waiting", 1)
    try:
        body = {"prompt": "Count:", "max_tokens": 200, "stream": True, "logit_bias": {"2": -100}}
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            with http.stream("POST", "/v1/completions", json=body) as running:
                lines = running.iter_lines()
                next(line for line in lines if line.startswith("data:"))
                with futures.ThreadPoolExecutor(1) as pool:
                    waiting = pool.submit(srv.post, "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
                    deadline = time.monotonic() + 30
                    while srv.metrics()["mlx_lm_batched_waiting_requests"] < 1:
                        assert time.monotonic() < deadline, srv.output()
                        time.sleep(0.1)
                    code, err, headers = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 3})
                    assert code == 429 and err["error"]["code"] == "too_many_requests"
                    assert int(headers["retry-after"]) >= 1
                    running.close()  # the running stream goes; the waiting request starts
                    code, out, _ = waiting.result(timeout=60)
                    assert code == 200 and out["usage"]["completion_tokens"] == 3
    finally:
        assert srv.stop() == 0, srv.output()


def test_sigterm_drains_and_exits_zero(server):
    """Last: SIGTERM while a stream runs; the stream ends whole and the process exits 0."""
    events, errors = [], []

    def consume():
        try:
            with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as http:
                body = {"prompt": "Once upon a time", "max_tokens": 24, "stream": True}
                with http.stream("POST", "/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data:"):
                            events.append(line[5:].strip())
        except Exception as e:  # reported below
            errors.append(e)

    reader = threading.Thread(target=consume)
    reader.start()
    deadline = time.monotonic() + 60
    while not events and time.monotonic() < deadline:
        time.sleep(0.05)
    assert events, server.output()
    tic = time.monotonic()
    status = server.stop(timeout=60)
    reader.join(30)
    assert status == 0, server.output()
    assert time.monotonic() - tic < 45
    assert not errors and events[-1] == "[DONE]", (errors, events[-3:])
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
    assert len(text) > 0
