"""Cancellation, backpressure and shutdown: the contracts in the docstrings."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest

import emlx_async as ea
from emlx_async import testing
from helpers import Gate, cancellable_spin, wait_started


# ---- cancellation --------------------------------------------------------------

async def test_cancelled_queued_job_never_runs(rt):
    q = rt.default_queue()
    gate, ran = Gate(), []
    first = q.run(gate, "first")
    await wait_started(gate)
    second = asyncio.ensure_future(q.run(ran.append, "second"))
    third = q.run(ran.append, "third")
    await asyncio.sleep(0)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    gate.open()
    assert await first == "first"
    await third
    assert ran == ["third"]
    assert q.pending == 0


async def test_cancelled_running_job_releases_awaiter_at_once_and_keeps_order(rt):
    q = rt.default_queue()
    gate, order = Gate(), []

    def running():
        gate()
        order.append("running")
        return "discarded"

    task = asyncio.ensure_future(q.run(running))
    await wait_started(gate)
    after = q.run(order.append, "after")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)  # released although the job is still running
    assert q.pending == 2  # the running job still holds its slot
    gate.open()
    await after
    assert order == ["running", "after"]
    assert q.pending == 0


async def test_running_python_job_can_poll_cancelled(rt):
    log: list[str] = []
    q = rt.default_queue()
    task = asyncio.ensure_future(q.run(cancellable_spin, log))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await q.synchronize()  # queued behind the spinning job
    assert log == ["saw-cancel"]
    assert not ea.cancelled()


async def test_cancelled_native_eval_is_dropped(rt):
    q = rt.default_queue()
    calls: list[str] = []

    def record(a):
        calls.append("evaluated")
        return a

    x = mx.ones(2)
    mx.eval(x)
    # A lazy graph on q whose evaluation is observable: it calls back to the loop.
    y, = await ea.host_call(record, x, outputs=[((2,), mx.float32)], queue=q)
    gate = Gate()
    q.run(gate)
    await wait_started(gate)
    eval_future = q.eval(y)
    eval_future.cancel()
    await asyncio.sleep(0)
    gate.open()
    await q.synchronize()
    await asyncio.sleep(0.05)
    assert eval_future.cancelled()
    assert calls == []  # the eval job was removed before it ran
    assert q.pending == 0
    await q.eval(y)  # evaluating it now does call back
    assert calls == ["evaluated"]


# ---- backpressure ----------------------------------------------------------------

async def test_backpressure_waits_or_raises_queue_full(loop_errors):
    async with ea.Runtime(max_pending=2) as runtime:
        q = runtime.default_queue()
        gate = Gate()
        first = q.run(gate, 1)
        second = q.run(lambda: 2)
        with pytest.raises(ea.QueueFull, match="max_pending=2"):
            q.run(lambda: 3, nowait=True)
        third = q.run(lambda: 3)  # waits for a slot
        await asyncio.sleep(0.01)
        assert not third.done() and q.pending == 3  # two on the worker, one waiting its turn
        gate.open()
        assert await asyncio.gather(first, second, third) == [1, 2, 3]
        assert q.pending == 0


async def test_cancelled_slot_waiter_does_not_leak_a_slot(loop_errors):
    async with ea.Runtime(max_pending=1) as runtime:
        q = runtime.default_queue()
        gate = Gate()
        first = q.run(gate)
        waiting = q.run(lambda: "never")
        await asyncio.sleep(0)
        waiting.cancel()
        gate.open()
        await first
        assert await q.run(lambda: "next") == "next"
        assert q.pending == 0


async def test_queue_keeps_fifo_order_under_backpressure(loop_errors):
    async with ea.Runtime(max_pending=3) as runtime:
        q = runtime.default_queue()
        order: list[int] = []
        futures = [q.run(order.append, i) for i in range(20)]
        await asyncio.gather(*futures)
        assert order == list(range(20))


# ---- shutdown --------------------------------------------------------------------

async def test_close_drains_pending_jobs(loop_errors):
    runtime = ea.Runtime()
    q = runtime.default_queue()
    done: list[int] = []
    futures = [q.run(done.append, i) for i in range(50)]
    await q.close()
    assert done == list(range(50))
    assert all(f.done() and not f.cancelled() for f in futures)
    with pytest.raises(ea.QueueClosed):
        q.run(lambda: 1)
    await runtime.close()


async def test_close_cancel_pending_drops_queued_jobs(loop_errors):
    runtime = ea.Runtime()
    q = runtime.default_queue()
    gate, ran = Gate(), []
    running = q.run(gate, "ran")
    await wait_started(gate)
    queued = [q.run(ran.append, i) for i in range(5)]
    closing = asyncio.create_task(q.close(cancel_pending=True))
    await asyncio.sleep(0.01)
    gate.open()
    await closing
    assert await running == "ran"
    for future in queued:
        with pytest.raises(ea.QueueClosed, match="never ran"):
            await future
    assert ran == []
    await runtime.close()


async def test_close_does_not_block_the_loop(loop_errors):
    runtime = ea.Runtime()
    q = runtime.default_queue()
    gate = Gate()
    q.run(gate)
    await wait_started(gate)
    closing = asyncio.create_task(runtime.close())
    await asyncio.sleep(0.02)
    assert not closing.done()  # the loop is free while the job finishes
    gate.open()
    await asyncio.wait_for(closing, 10)


async def test_runtime_close_leaves_no_worker_fd_or_job(loop_errors):
    fds = testing.open_fds()
    runtime = ea.Runtime(pool_size=3)
    async with runtime.queue() as q1, runtime.queue() as q2:
        await asyncio.gather(q1.run(lambda: mx.ones(3).sum()), q2.run(lambda: 1))
    runtime.default_queue()
    assert testing.active_workers() == 3
    await runtime.close()
    assert testing.active_workers() == 0
    assert testing.open_fds() == fds
    assert not runtime._jobs
    with pytest.raises(ea.RuntimeClosed):
        runtime.default_queue()
    with pytest.raises(ea.QueueClosed):
        q1.run(lambda: 1)
    await runtime.close()  # twice is fine


async def test_workers_are_reused_so_threads_stay_bounded(loop_errors):
    for _ in range(2):  # warm up: park the workers this test needs
        async with ea.Runtime(pool_size=2) as runtime:
            async with runtime.queue() as a, runtime.queue() as b:
                await asyncio.gather(a.run(lambda: 1), b.run(lambda: 2))
    threads = testing.thread_count()
    for _ in range(10):
        async with ea.Runtime(pool_size=2) as runtime:
            async with runtime.queue() as a, runtime.queue() as b:
                await asyncio.gather(a.run(lambda: 1), b.run(lambda: 2))
    assert testing.thread_count() == threads


def test_garbage_collected_open_runtime_warns():
    import gc
    import time

    loop = asyncio.new_event_loop()

    async def make():
        runtime = ea.Runtime()
        await runtime.default_queue().run(lambda: 1)
        return runtime

    runtime = loop.run_until_complete(make())
    loop.close()
    with pytest.warns(ResourceWarning, match="unclosed emlx_async runtime"):
        del runtime
        gc.collect()
    for _ in range(500):  # the released worker parks shortly after
        if testing.active_workers() == 0:
            break
        time.sleep(0.01)
