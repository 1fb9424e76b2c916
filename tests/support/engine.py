"""Helpers for tests that run the engine: its streams collected, its driver settled."""

from __future__ import annotations

import anyio

PARIS = "The capital of France is"  # a short raw prompt where the chat template is not the point


async def settle(engine):
    """Wait until the batch driver (if any) has gone idle and handed its queue back."""
    await engine.wait_idle()  # a failed driver may have started a new one: it waits for that too


async def collect(engine, **kwargs):
    """The streamed text and the token ids of one ``engine.generate(**kwargs)``."""
    text, tokens = "", []
    async for delta in engine.generate(**kwargs):
        text += delta.text
        if delta.token is not None:
            tokens.append(delta.token)
    return text, tokens


async def answer_of(engine, prompt="Hello", **kwargs) -> tuple[str, list[int], str | None]:
    """The text, token ids and finish reason of one ``engine.generate(prompt, **kwargs)``, within 60 s."""
    text, tokens, finish = "", [], None
    with anyio.fail_after(60):
        async for delta in engine.generate(prompt, **kwargs):
            text += delta.text
            if delta.token is not None:
                tokens.append(delta.token)
            finish = delta.finish_reason
    return text, tokens, finish


async def tokens_of(engine, prompt, **options) -> list[int]:
    """The token ids of one ``engine.generate(prompt, **options)``."""
    return [d.token async for d in engine.generate(prompt, **options) if d.token is not None]


async def tokens_into(into: list[int], engine, *, started: anyio.Event | None = None, after: int = 1,
                      **request) -> None:
    """Append the token ids of ``engine.generate(**request)`` to `into` as they come; set
    `started` once `after` are in (another request may then join a running batch)."""
    async for delta in engine.generate(**request):
        if delta.token is not None:
            into.append(delta.token)
            if started is not None and len(into) == after:
                started.set()


async def concurrently(engine, requests: list[dict]) -> list[list[int]]:
    """Each request's tokens (a request: generate()'s arguments), all running at once."""
    results: list[list[int]] = [[] for _ in requests]

    async def one(i):
        results[i] = await tokens_of(engine, **requests[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(requests)):
            tg.start_soon(one, i)
    return results


class Counting:
    """The model, with the shapes of the token arrays it is called with."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, tokens, cache=None):
        self.calls.append(tuple(tokens.shape))
        return self.model(tokens, cache=cache)

    def __getattr__(self, name):
        return getattr(self.model, name)
