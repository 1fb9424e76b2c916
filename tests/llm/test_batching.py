"""Batch mode's driver and the loop it belongs to."""

from __future__ import annotations

import asyncio
import threading

import anyio
import pytest

import emlx_async as ea
from support.helpers import on_loops
from support.tiny_models import IdsTokenizer, tiny


async def _greedy(engine, prompt):
    return [d.token async for d in engine.generate(prompt, max_tokens=3) if d.token is not None]


@on_loops("asyncio")
async def test_a_batch_engine_used_from_another_loop_is_refused_and_its_own_loop_keeps_it():
    """Its driver feeds streams on its runtime's loop: a request from another loop (alive or
    closed) got no tokens ever (a hang), or a driver that never started."""
    from emlx_async.llm import Engine

    made, done = {}, threading.Event()

    def other_loop():
        async def main():
            engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None,
                            runtime=ea.get_runtime(), mode="batch", max_concurrent=2)
            await engine.prepare_step("replay", cache_sizes=(64,))
            made["engine"], made["tokens"] = engine, await _greedy(engine, [1, 2, 3])
            while not done.is_set():  # the loop stays alive while the main loop tries the engine
                await asyncio.sleep(0.005)
            made["after"] = await _greedy(engine, [1, 2, 3])
            await engine.wait_idle()
        asyncio.run(main())

    thread = threading.Thread(target=other_loop)
    thread.start()
    try:
        with anyio.fail_after(30):
            while "tokens" not in made:
                await anyio.sleep(0.01)
            with pytest.raises(ea.RuntimeClosed, match="another event loop"):
                await _greedy(made["engine"], [1, 2, 3])
    finally:
        done.set()
        await anyio.to_thread.run_sync(thread.join, 30)
    assert len(made["tokens"]) == 3 and made["after"] == made["tokens"]
    with pytest.raises(ea.RuntimeClosed):  # its loop closed with its runtime
        await _greedy(made["engine"], [1, 2, 3])
