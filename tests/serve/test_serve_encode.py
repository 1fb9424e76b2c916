"""The service's prompt bound is checked before tokenizing: a prompt whose text
alone must exceed --max-prompt-tokens is refused without being encoded."""

from __future__ import annotations

import pytest

from support.helpers import needs_model, on_loops

pytestmark = [pytest.mark.model, needs_model]
pytest.importorskip("starlette")


async def service(rt):
    """The ``service`` argument: a Service holding SmolLM2 on the test's runtime."""
    from emlx_async.llm import Engine
    from emlx_async.serve.service import ServeConfig, Service

    service = Service(ServeConfig(max_prompt_tokens=100))
    service.engine = await Engine.load(runtime=rt, step="python")
    yield service


def encode(service, request):
    return service.encode(service.models.default, request)


@on_loops("asyncio", "uvloop", fixtures={"service": service})
@pytest.mark.parametrize("chat", [False, True], ids=["prompt", "messages"])
async def test_a_prompt_past_the_bound_is_refused_before_it_is_encoded(service, chat, monkeypatch):
    from emlx_async.serve.protocol import APIError, parse_request

    text = "word " * 5000  # ~5000 tokens; no token covers more than a few dozen bytes
    body = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    request = parse_request(body, chat=chat)
    engine = service.engine

    def never(*args, **kwargs):
        raise AssertionError("the prompt was encoded")

    monkeypatch.setattr(engine, "encode", never)
    with pytest.raises(APIError) as refused:
        encode(service, request)
    assert refused.value.code == "context_length_exceeded" and refused.value.param == ("messages" if chat else "prompt")
    # A chat's prompt is more than its messages: the message says what it holds (a long system prompt).
    assert ("the system prompt and the tools" in refused.value.message) == chat
    monkeypatch.undo()

    # Under the text bound but over the token bound: refused after encoding, with the count.
    short = parse_request({"prompt": "word " * 150}, chat=False)
    with pytest.raises(APIError) as counted:
        encode(service, short)
    assert "tokens)" in counted.value.message
    fits = parse_request({"prompt": "word " * 20}, chat=False)
    assert 20 <= len(encode(service, fits)) <= 100
