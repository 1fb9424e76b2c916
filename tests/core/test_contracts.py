"""Cancellation, backpressure and shutdown: the contracts in the docstrings,
each run under asyncio, uvloop and trio (``on_every_loop``).

Cancelling an awaiter is done the way each library does it: the awaiting
task's cancel scope (``Awaiter``), so under asyncio a task cancellation and
under trio a cancel scope, with the same contract.
"""

from __future__ import annotations

import gc
import time
import warnings
import weakref

import anyio
import mlx.core as mx
import pytest

import emlx_async as ea
from emlx_async import testing
from support.helpers import Awaiter, Gate, cancellable_spin, on_every_loop, started, wait_all


# ---- cancellation --------------------------------------------------------------

@on_every_loop
async def test_cancelled_queued_job_never_runs():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        gate, ran = Gate(), []
        first = q.run(gate, "first")
        await started(gate)
        async with anyio.create_task_group() as tg:
            second = Awaiter(tg, q.run(ran.append, "second"))
            third = q.run(ran.append, "third")
            await anyio.sleep(0.01)
            second.cancel()
            await second.done.wait()
        assert second.outcome == "cancelled"
        gate.open()
        assert await first == "first"
        await third
        assert ran == ["third"]
        assert q.pending == 0


@on_every_loop
async def test_cancelled_running_job_releases_awaiter_at_once_and_keeps_order():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        gate, order = Gate(), []

        def running():
            gate()
            order.append("running")
            return "discarded"

        async with anyio.create_task_group() as tg:
            awaiter = Awaiter(tg, q.run(running))
            await started(gate)
            after = q.run(order.append, "after")
            awaiter.cancel()
            with anyio.fail_after(1):
                await awaiter.done.wait()  # released although the job is still running
        assert awaiter.outcome == "cancelled"
        assert q.pending == 2  # the running job still holds its slot
        gate.open()
        await after
        assert order == ["running", "after"]
        assert q.pending == 0


@on_every_loop
async def test_running_python_job_can_poll_cancelled():
    async with ea.Runtime() as rt:
        log: list[str] = []
        q = rt.default_queue()
        async with anyio.create_task_group() as tg:
            awaiter = Awaiter(tg, q.run(cancellable_spin, log))
            await anyio.sleep(0.05)
            awaiter.cancel()
        assert awaiter.outcome == "cancelled"
        await q.synchronize()  # queued behind the spinning job
        assert log == ["saw-cancel"]
        assert not ea.cancelled()


@on_every_loop
async def test_cancelled_native_eval_is_dropped():
    async with ea.Runtime() as rt:
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
        await started(gate)
        eval_future = q.eval(y)
        eval_future.cancel()
        gate.open()
        await q.synchronize()
        await anyio.sleep(0.05)
        assert eval_future.cancelled()
        assert calls == []  # the eval job was removed before it ran
        assert q.pending == 0
        await q.eval(y)  # evaluating it now does call back
        assert calls == ["evaluated"]


# ---- backpressure ----------------------------------------------------------------

@on_every_loop
async def test_backpressure_waits_or_raises_queue_full():
    async with ea.Runtime(max_pending=2) as runtime:
        q = runtime.default_queue()
        gate = Gate()
        first = q.run(gate, 1)
        second = q.run(lambda: 2)
        with pytest.raises(ea.QueueFull, match="max_pending=2"):
            q.run(lambda: 3, nowait=True)
        third = q.run(lambda: 3)  # waits for a slot
        await anyio.sleep(0.01)
        assert not third.done() and q.pending == 3  # two on the worker, one waiting its turn
        gate.open()
        assert await wait_all(first, second, third) == [1, 2, 3]
        assert q.pending == 0


@on_every_loop
async def test_cancelled_slot_waiter_does_not_leak_a_slot():
    async with ea.Runtime(max_pending=1) as runtime:
        q = runtime.default_queue()
        gate = Gate()
        first = q.run(gate)
        waiting = q.run(lambda: "never")
        await anyio.sleep(0)
        waiting.cancel()
        gate.open()
        await first
        assert await q.run(lambda: "next") == "next"
        assert q.pending == 0


@on_every_loop
async def test_queue_keeps_fifo_order_under_backpressure():
    async with ea.Runtime(max_pending=3) as runtime:
        q = runtime.default_queue()
        order: list[int] = []
        await wait_all(*[q.run(order.append, i) for i in range(20)])
        assert order == list(range(20))


# ---- shutdown --------------------------------------------------------------------

@on_every_loop
async def test_close_drains_pending_jobs():
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


@on_every_loop
async def test_close_cancel_pending_drops_queued_jobs():
    runtime = ea.Runtime()
    q = runtime.default_queue()
    gate, ran = Gate(), []
    running = q.run(gate, "ran")
    await started(gate)
    queued = [q.run(ran.append, i) for i in range(5)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: q.close(cancel_pending=True))
        await anyio.sleep(0.01)
        gate.open()
    assert await running == "ran"
    for future in queued:
        with pytest.raises(ea.QueueClosed, match="never ran"):
            await future
    assert ran == []
    await runtime.close()


@on_every_loop
async def test_close_does_not_block_the_loop():
    runtime = ea.Runtime()
    q = runtime.default_queue()
    gate = Gate()
    q.run(gate)
    await started(gate)
    closed = anyio.Event()

    async def close():
        await runtime.close()
        closed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close)
        await anyio.sleep(0.02)
        assert not closed.is_set()  # the loop is free while the job finishes
        gate.open()
        with anyio.fail_after(10):
            await closed.wait()


@on_every_loop
async def test_close_wakes_tasks_waiting_for_a_pooled_queue():
    runtime = ea.Runtime(pool_size=2)
    await runtime.acquire_queue()
    await runtime.acquire_queue()
    got: list[BaseException] = []

    async def wait_for_a_queue():
        try:
            await runtime.acquire_queue()
        except ea.RuntimeClosed as exc:
            got.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_a_queue)
            await anyio.sleep(0.02)
            await runtime.close()
    assert len(got) == 1


@on_every_loop
async def test_cancelled_runtime_block_does_not_wait_for_its_running_job():
    """A cancelled (or interrupted) `async with ea.Runtime()` leaves at once: nobody can
    await its jobs any more, so the running one is abandoned, as at a run's end."""
    gate = Gate()
    queued = None
    start = time.monotonic()
    with anyio.move_on_after(0.2):
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            running, queued = q.run(gate), q.run(lambda: "never")
            await running
    left_after = time.monotonic() - start
    gate.open()
    assert left_after < 5, f"the block waited {left_after:.1f} s for its running job"
    with pytest.raises(ea.QueueClosed, match="ended with Cancelled"):
        await queued


@on_every_loop
async def test_a_job_in_flight_keeps_its_unreferenced_runtime_alive():
    """A runtime nobody references is not collected under its jobs: they still complete."""
    runtime = ea.Runtime()
    future = runtime.default_queue().run(lambda: 7)
    runtimes = [weakref.ref(runtime)]
    del runtime
    orphan = ea.Runtime().default_queue()  # its runtime referenced by the queue alone
    runtimes.append(weakref.ref(orphan._owner))
    gc.collect()
    with anyio.fail_after(10):
        assert await future == 7
        assert await orphan.run(lambda: 8) == 8
    for ref in runtimes:
        await ref().close()


@on_every_loop
async def test_cancelled_runtime_blocks_do_not_keep_their_runtimes():
    refs = []
    for _ in range(5):
        gate = Gate()
        with anyio.move_on_after(0.05):
            async with ea.Runtime() as rt:
                refs.append(weakref.ref(rt))
                await rt.default_queue().run(gate)
        gate.open()
        del rt
    await anyio.sleep(0.1)  # the last abandoned job returns; the loop drops what it held of the last block
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0


@on_every_loop
async def test_an_unclosed_runtime_dropped_while_its_loop_runs_is_collected_and_warns():
    async def use():
        runtime = ea.Runtime()
        await runtime.default_queue().run(lambda: 1)
        return weakref.ref(runtime)

    ref = await use()
    messages = _collected_warnings(lambda: None)
    assert ref() is None
    assert sum("unclosed emlx_async runtime" in m for m in messages) == 1, messages


def test_runtimes_of_closed_loops_are_released():
    """loop.close() after run_until_complete never shuts down async generators, so the
    implicit runtime's closer never runs: the next one made releases it."""
    import asyncio

    async def use():
        await ea.ops.add(mx.ones(2), 1)

    def run_once():
        loop = asyncio.new_event_loop()
        loop.run_until_complete(use())
        loop.close()

    run_once()
    fds, threads = testing.open_fds(), testing.thread_count()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        for _ in range(5):
            run_once()
        gc.collect()
        asyncio.run(use())  # releases the last loop's runtime, and closes its own
    _wait_for_workers_to_park()
    assert testing.active_workers() == 0
    assert len(testing.open_fds() - fds) <= 0
    # Released workers park and are reused; one may still be parking when the next is wanted.
    assert testing.thread_count() <= threads + 2


@on_every_loop
async def test_runtime_close_leaves_no_worker_fd_or_job():
    fds = testing.open_fds()
    runtime = ea.Runtime(pool_size=3)
    async with runtime.queue() as q1, runtime.queue() as q2:
        await wait_all(q1.run(lambda: mx.ones(3).sum()), q2.run(lambda: 1))
    runtime.default_queue()
    assert testing.active_workers() == 3
    await runtime.close()
    assert testing.active_workers() == 0
    assert not runtime._jobs
    with pytest.raises(ea.RuntimeClosed):
        runtime.default_queue()
    with pytest.raises(ea.QueueClosed):
        q1.run(lambda: 1)
    await runtime.close()  # twice is fine
    # The channel's eventfd is closed (the loop's own fds are checked after
    # the run, by conftest's leak check).
    import os

    new = testing.open_fds() - fds
    assert not [fd for fd in new if "eventfd" in os.readlink(f"/proc/self/fd/{fd}")]


@on_every_loop
async def test_workers_are_reused_so_threads_stay_bounded():
    for _ in range(2):  # warm up: park the workers this test needs
        async with ea.Runtime(pool_size=2) as runtime:
            async with runtime.queue() as a, runtime.queue() as b:
                await wait_all(a.run(lambda: 1), b.run(lambda: 2))
    threads = testing.thread_count()
    for _ in range(10):
        async with ea.Runtime(pool_size=2) as runtime:
            async with runtime.queue() as a, runtime.queue() as b:
                await wait_all(a.run(lambda: 1), b.run(lambda: 2))
    assert testing.thread_count() == threads


def _collected_warnings(drop) -> list[str]:
    """The ResourceWarnings raised while `drop()` lets objects go and gc runs.

    A recorded warning keeps its source alive, so the messages are taken and
    the records dropped before a second collection frees what they held.
    """
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        drop()
        for _ in range(3):
            gc.collect()
            messages += [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
            caught.clear()
    return messages


def _wait_for_workers_to_park() -> None:
    for _ in range(500):  # a released worker parks shortly after
        if testing.active_workers() == 0:
            break
        time.sleep(0.01)


def test_garbage_collected_open_runtime_warns():
    import asyncio

    loop = asyncio.new_event_loop()

    async def make():
        runtime = ea.Runtime()
        await runtime.default_queue().run(lambda: 1)
        return runtime

    held = [loop.run_until_complete(make())]
    loop.close()
    messages = _collected_warnings(held.clear)
    assert sum("unclosed emlx_async runtime" in m for m in messages) == 1, messages
    _wait_for_workers_to_park()


@pytest.mark.parametrize("debug", [False, True])
def test_garbage_collected_open_queue_warns_with_where_it_was_made(debug):
    import asyncio

    loop = asyncio.new_event_loop()
    loop.set_debug(debug)

    async def make():
        runtime = ea.Runtime()
        queue = await runtime.acquire_queue()  # never given back, never closed
        assert await queue.run(lambda: 2) == 2
        return runtime, queue

    held = list(loop.run_until_complete(make()))
    loop.close()
    messages = _collected_warnings(held.clear)
    queue_warnings = [m for m in messages if "unclosed emlx_async queue" in m]
    assert len(queue_warnings) == 1, messages
    assert ("created at:" in queue_warnings[0]) is debug
    if debug:
        assert "acquire_queue" in queue_warnings[0]
    _wait_for_workers_to_park()
    assert testing.active_workers() == 0  # the queue handed its worker back


def test_closed_queues_and_runtimes_never_warn():
    import asyncio

    async def make():
        async with ea.Runtime() as runtime:
            queue = await runtime.acquire_queue()
            await queue.run(lambda: 1)
            await queue.close()
            async with runtime.queue() as lent:
                await lent.run(lambda: 2)
            return runtime, queue

    held = list(asyncio.run(make()))
    assert _collected_warnings(held.clear) == []


@on_every_loop
async def test_runtime_options_are_checked_by_name():
    for options, error, words in (({"max_pending": "3"}, TypeError, "max_pending must be an int"),
                                  ({"max_pending": 0}, ValueError, "max_pending must be at least 1"),
                                  ({"pool_size": 1.5}, TypeError, "pool_size must be an int"),
                                  ({"pool_size": True}, TypeError, "pool_size must be an int"),
                                  ({"pool_size": 0}, ValueError, "pool_size must be at least 1")):
        with pytest.raises(error, match=words):
            ea.Runtime(**options)
