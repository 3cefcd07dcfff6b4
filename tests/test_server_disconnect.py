"""A client that goes away stops its generation, on every generating route, streamed or not.

Each case runs on a real server (SmolLM2, float32) with two long greedy requests of the
same prompt: a *twin*, a streamed request that stays connected, and the *victim*, sent
on a raw socket that is closed once both requests' rows are in the batch (the
``running_rows`` gauge of ``/metrics``). The victim's row must leave the batch within
``LEAVE_S`` while the twin's row (the same tokens, so not at its end either) still runs;
then closing the twin empties the batch, and the server still answers.
"""

import json
import socket
import time

import pytest

from conftest import model_dir
from server_harness import ServerProcess

MAX_TOKENS = 2000  # far more than the cases run: a row still there at the end is a leak
LEAVE_S = 30.0  # bound for a dropped request's row to leave (one disconnect poll + steps)
CHAT_TEXT = "Write the numbers from 1 to 1000 separated by commas."  # greedy: no early EOS
TEXT_PROMPT = "1, 2, 3, 4, 5,"
MESSAGES = [{"role": "user", "content": CHAT_TEXT}]


def body(path, stream, max_tokens=MAX_TOKENS):
    """A greedy request body for ``path`` (the same rendered prompt on the chat routes)."""
    common = {"temperature": 0, "stream": stream}
    if path == "/v1/chat/completions":
        return {"messages": MESSAGES, "max_tokens": max_tokens, **common}
    if path == "/v1/completions":
        return {"prompt": TEXT_PROMPT, "max_tokens": max_tokens, **common}
    if path == "/v1/responses":
        return {"input": CHAT_TEXT, "max_output_tokens": max_tokens, **common}
    return {"messages": MESSAGES, "max_tokens": max_tokens, **common}  # /v1/messages


def twin_of(path):
    """The streamed request that generates the same tokens as a request to ``path``."""
    twin_path = "/v1/completions" if path == "/v1/completions" else "/v1/chat/completions"
    return twin_path, body(twin_path, True)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(model_dir("smollm2", dtype="float32"), "--max-batch", 8)
    yield srv
    assert srv.stop() == 0, srv.output()


def open_request(server, path, payload):
    """A raw HTTP/1.1 request left open (its response is never read to the end)."""
    data = json.dumps(payload).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def drop(sock):
    """The client goes away: the connection is closed without reading the answer."""
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def running_rows(server):
    return server.metrics()["mlx_lm_batched_running_rows"]


def wait_rows(server, want, timeout):
    """Seconds until ``running_rows == want``; fails after ``timeout`` seconds."""
    start = time.monotonic()
    while True:
        rows = running_rows(server)
        if rows == want:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"running_rows is {rows}, not {want}, " \
                                                   f"{timeout:g} s on"
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                  "/v1/messages"])
def test_dropped_client_leaves_the_batch(server, path, stream):
    wait_rows(server, 0, LEAVE_S)  # nothing left over from the case before
    twin = open_request(server, *twin_of(path))
    try:
        wait_rows(server, 1, LEAVE_S)
        victim = open_request(server, path, body(path, stream))
        wait_rows(server, 2, LEAVE_S)
        if stream:  # the stream has started: its headers and first event are here
            assert victim.recv(4096).startswith(b"HTTP/1.1 200")
        drop(victim)
        wait_rows(server, 1, LEAVE_S)  # the victim left, the twin (same tokens) runs on
    finally:
        drop(twin)
    wait_rows(server, 0, LEAVE_S)
    status, answer, _ = server.post(path, body(path, False, max_tokens=3))
    assert status == 200, answer
    wait_rows(server, 0, LEAVE_S)  # the gauge is set after the step that ended the row
