"""Helpers for tests that run the engine: its streams collected, its driver settled."""

from __future__ import annotations

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
