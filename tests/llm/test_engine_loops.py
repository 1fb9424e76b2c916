"""The engine under asyncio, uvloop and trio: one representative model run per loop.

The model is slow on CPU, so test_engine.py runs its many model cases under
asyncio only and test_trio.py has trio's nursery of streams; here the
engine's loop-facing parts (request slots, token streams, the batch driver
task, cancellation, the loop staying responsive) run once per loop, in batch
mode (the mode with a background driver task; parallel mode's requests are
plain queue jobs, covered on every loop by the queue tests).
"""

from __future__ import annotations

import anyio
import pytest

import emlx_async as ea
from emlx_async.testing import LoopLag
from support.helpers import needs_model, on_every_loop

pytestmark = [pytest.mark.model, needs_model]

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]  # short token-id prompts of different lengths (the batch pads them)


async def greedy(engine, prompt, max_tokens=3):
    return [d.token async for d in engine.generate(prompt=prompt, max_tokens=max_tokens) if d.token is not None]


@on_every_loop
async def test_concurrent_and_cancelled_streams_in_batch_mode():
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=3) as rt:
        engine = await Engine.load(runtime=rt, max_concurrent=3, mode="batch")
        alone = [await greedy(engine, p) for p in PROMPTS]
        together: dict[int, list[int]] = {}

        async def one(i):
            together[i] = await greedy(engine, PROMPTS[i])

        async with LoopLag() as lag, anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
        assert [together[i] for i in range(len(PROMPTS))] == alone
        assert len(lag.samples) > 3, "the loop did not run while the engine decoded"

        # A stream closed by its reader and a request cancelled by a scope
        # both free their batch row; the next request gets the same tokens.
        stream = engine.generate(prompt=PROMPTS[0], max_tokens=50)
        await stream.__anext__()
        await stream.aclose()
        with anyio.move_on_after(0.01) as scope:
            await greedy(engine, PROMPTS[1], max_tokens=50)
        assert scope.cancelled_caught
        assert await greedy(engine, PROMPTS[0]) == alone[0]
        await engine.wait_idle()
        assert engine.active_requests == 0
        assert not engine._batcher.running and not engine._replay_batcher.running
