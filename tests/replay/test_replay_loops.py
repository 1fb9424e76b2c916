"""Trace, replay and ea.compile under asyncio, uvloop and trio."""

from __future__ import annotations


import emlx_async as ea
from support.arrays import close, matmul_reduce, rand, several
from support.helpers import on_every_loop


@on_every_loop
async def test_trace_and_replay_on_every_loop():
    x, y = rand(4, 8), rand(8, 6)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(several, x, y, queue=q)
        close(await f(x, y, queue=q), several(x, y))
        cfn = ea.compile(matmul_reduce)
        close(await cfn(x, y, queue=q), matmul_reduce(x, y))
        f.release()
