"""Jobs started the way each library starts tasks: trio's ``nursery.start_soon(q.run, fn)``,
anyio's task groups, ``asyncio.create_task(q.run(fn))`` and ``asyncio.ensure_future``.

A job's future passes as a coroutine there; the job takes its place in the
queue when ``q.run`` (or an op) is called, not when the task first runs.
"""

from __future__ import annotations

import asyncio

import anyio
import mlx.core as mx
import pytest

import emlx_async as ea
from support.helpers import Gate, on_every_loop, on_loops, started

trio = pytest.importorskip("trio")


def _recorder(log: list):
    def job(value):
        log.append(value)
        return value

    return job


@on_every_loop
async def test_a_task_group_starts_every_submitting_call_in_call_order(rt):
    q = rt.default_queue()
    log: list = []
    job = _recorder(log)
    x = mx.arange(4)
    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(q.run, job, i)
        tg.start_soon(ea.ops.add, x, 1)
        tg.start_soon(q.eval, x)
        tg.start_soon(q.synchronize)
        # Submitted now, awaited here before any of the group's tasks has run:
        # it still runs after them, because they were submitted first.
        assert await q.run(job, "direct") == "direct"
    assert log == [0, 1, 2, 3, 4, "direct"]


@on_every_loop
async def test_the_top_level_calls_take_their_place_at_the_call(rt):
    """ea.run, ea.eval, ea.item, ea.to_numpy and ea.synchronize submit when called, so a
    task group (trio's starts its tasks in no fixed order) keeps their call order."""
    q = rt.default_queue()
    gate = Gate()
    blocker = q.run(gate)
    await started(gate)
    log: list = []
    job = _recorder(log)
    got: dict = {}

    async def keep(name, awaitable):
        got[name] = await awaitable

    async with anyio.create_task_group() as tg:  # the unbound calls go to q, the default queue
        for i in range(20):
            tg.start_soon(ea.run, job, i)
        tg.start_soon(ea.synchronize)
        tg.start_soon(keep, "item", ea.item(mx.array(3) + 2))
        tg.start_soon(keep, "numpy", ea.to_numpy(mx.ones(2)))
        tg.start_soon(keep, "eval", ea.eval(mx.arange(3) * 2))
        await anyio.sleep(0.01)
        gate.open()
    await blocker
    assert log == list(range(20))
    assert got["item"] == 5 and got["numpy"].tolist() == [1.0, 1.0] and got["eval"].tolist() == [0, 2, 4]


@on_every_loop
async def test_a_task_group_gets_the_job_error(rt):
    def fails():
        raise ValueError("from the job")

    with pytest.raises(BaseException) as caught:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.default_queue().run, fails)
    errors = caught.value.exceptions if isinstance(caught.value, BaseExceptionGroup) else [caught.value]
    assert [type(e) for e in errors] == [ValueError] and "from the job" in str(errors[0])


@on_every_loop
async def test_cancelling_a_task_group_cancels_its_queued_jobs(rt):
    q = rt.default_queue()
    gate = Gate()
    log: list = []
    blocker = q.run(gate)
    await started(gate)
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run, _recorder(log), "queued")
        await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    gate.open()
    await blocker
    assert await q.run(lambda: "after") == "after"
    assert log == []  # dropped from the queue, never ran


def test_a_trio_nursery_starts_q_run_and_ops():
    async def main():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            log: list = []
            results: dict = {}

            async def keep(name, awaitable):
                results[name] = await awaitable

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(q.run, _recorder(log), i)
                nursery.start_soon(ea.ops.add, mx.ones(2), 1.0)
                nursery.start_soon(keep, "sum", ea.ops.add(mx.ones(2), 1.0))
                # The nursery's tasks have not run yet; their jobs are ahead of this one.
                assert await q.run(_recorder(log), "direct") == "direct"
            assert log == [0, 1, 2, "direct"]
            assert results["sum"].tolist() == [2.0, 2.0]

    trio.run(main)


@on_loops("asyncio", "uvloop")
async def test_asyncio_create_task_and_ensure_future_hold_a_job():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        task = asyncio.create_task(q.run(lambda: 1))
        held = asyncio.ensure_future(q.run(lambda: 2))
        product = asyncio.create_task(ea.ops.multiply(mx.ones(3), 2.0))
        assert await task == 1 and await held == 2
        assert (await product).tolist() == [2.0, 2.0, 2.0]


@on_loops("asyncio", "uvloop")
async def test_a_task_cancelled_before_its_first_step_cancels_its_job():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        gate = Gate()
        log: list = []
        blocker = q.run(gate)
        await started(gate)
        task = asyncio.create_task(q.run(_recorder(log), "never"))
        task.cancel()  # before the task ever ran
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.open()
        await blocker
        assert await q.run(lambda: "next") == "next"
        assert log == []


def test_top_level_calls_made_outside_a_loop_run_when_the_loop_starts_them():
    assert asyncio.run(ea.run(lambda: 3)) == 3
    assert asyncio.run(ea.eval(mx.ones(2) * 2)).tolist() == [2.0, 2.0]
    assert trio.run(ea.item, mx.array(4) + 1) == 5
    assert asyncio.run(ea.synchronize()) is None


@on_every_loop
async def test_item_and_to_numpy_name_a_value_that_is_not_an_array(rt):
    for call in (ea.item, ea.to_numpy):
        for value in (3, None, [1.0]):
            with pytest.raises(TypeError, match=r"takes an mx.array, got"):
                call(value)
