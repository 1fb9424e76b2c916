"""Regression tests for the core's contracts: memory safety at the C ABI,
submission order, donation, pool hand-back, liveness checks.

Each test reproduces a defect found on an earlier main and asserts the
documented behaviour instead.
"""

from __future__ import annotations

import time

import anyio
import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async import _native, testing
from support.helpers import Gate, on_every_loop, run_python, started


def assert_same(a, b):
    np.testing.assert_array_equal(np.array(a), np.array(b))


# ---- memory safety at the C ABI --------------------------------------------------

@on_every_loop
async def test_host_call_output_after_its_runtime_closed_is_a_clear_error():
    # The node used to keep a raw pointer to its runtime's channel: after the
    # runtime closed and a new one reused the parked worker, evaluating it
    # locked a freed mutex.
    x = mx.arange(4, dtype=mx.float32)
    mx.eval(x)
    async with ea.Runtime(pool_size=2) as first:
        q = first.default_queue()
        y, = await ea.host_call(lambda a: a * 2, x, outputs=[((4,), mx.float32)], queue=q)
        assert first.queue_of(y) is q  # still a lazy graph owned by q
    async with ea.Runtime(pool_size=64) as second:
        lent = []
        while second.queue_of(y) is None:  # take parked workers until q's comes back
            assert len(lent) < 64, "the parked worker was never reused"
            lent.append(await second.acquire_queue())
        reused = second.queue_of(y)
        assert reused.stream_index == q.stream_index  # the same parked worker and stream
        with pytest.raises(ea.RuntimeClosed, match="runtime that built this host call is closed"):
            await ea.eval(y)
        assert await reused.run(lambda: 7) == 7  # the queue keeps working
        for queue in lent:
            second.release_queue(queue)


def test_queues_after_interpreter_shutdown_raise_instead_of_touching_freed_workers():
    result = run_python("""
        import asyncio
        import emlx_async as ea
        from emlx_async import _native

        async def main():
            rt = ea.Runtime()
            q = rt.default_queue()
            assert await q.run(lambda: 1) == 1
            _native._shutdown_at_exit()  # what the exit hook does: every worker is freed
            for call in (lambda: q.run(lambda: 2), lambda: q.eval(), lambda: q.synchronize(),
                         lambda: rt.default_queue()):
                try:
                    call()
                except ea.RuntimeClosed as exc:
                    print("closed:", exc, flush=True)
            await rt.close()
            print("ok", flush=True)

        asyncio.run(main())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("closed: the interpreter is exiting") == 4
    assert "ok" in result.stdout


@on_every_loop
async def test_native_release_twice_returns_a_status_and_its_message():
    async with ea.Runtime(pool_size=4) as rt:
        # Every exported call returns a status and keeps its message for this
        # thread; no C++ exception crosses the ABI.
        q = await rt.acquire_queue()
        lib = _native.lib
        assert lib.emlx_worker_release(q._worker, 10**12, 0) == 0
        assert lib.emlx_worker_release(q._worker, 10**12 + 1, 0) == -1
        assert "already released" in _native.last_error()
        with pytest.raises(ea.EMLXError, match="already released"):
            _native.ensure(lib.emlx_worker_release(q._worker, 10**12 + 2, 0), "release")
        for _ in range(500):  # the first release's stop marker parks the worker shortly
            if testing.active_workers() == 0:
                break
            await anyio.sleep(0.01)
        rt.release_queue(q)


# ---- submission order --------------------------------------------------------------

@on_every_loop
async def test_a_job_waiting_on_a_foreign_lazy_input_keeps_its_place():
    async with ea.Runtime(pool_size=4) as rt:
        # A job whose lazy input is owned by another queue used to come back as a
        # Task and run after a job submitted later (['B', 'A']).
        other, mine = await rt.acquire_queue(), await rt.acquire_queue()
        try:
            gate, order = Gate(), []
            other.run(gate)
            await started(gate)
            lazy_future = other.run(lambda: mx.ones(3) * 2, lazy=True)
            gate.open()
            lazy = await lazy_future
            assert rt.queue_of(lazy) is other
            gate2 = Gate()
            other.run(gate2)  # the lazy input's owner is busy: A must wait for it
            await started(gate2)
            a = mine.run(lambda x: order.append("A") or x.sum(), lazy)
            b = mine.run(lambda: order.append("B"))
            assert all(isinstance(f, (ea.JobFuture, ea.TrioJobFuture)) for f in (a, b))
            await anyio.sleep(0.05)
            assert order == []  # B waits behind A
            gate2.open()
            assert (await a).item() == 6.0
            await b
            assert order == ["A", "B"]
        finally:
            rt.release_queue(other)
            rt.release_queue(mine)


@on_every_loop
async def test_bounds_checked_ops_keep_their_place():
    async with ea.Runtime(pool_size=4) as rt:
        previous = ea.ops.set_bounds_checks(True)
        try:
            q = rt.default_queue()
            gate, order = Gate(), []
            q.run(gate)
            await started(gate)
            a = mx.arange(10)
            idx = mx.array([1, 2, 3])
            taken = ea.ops.take(a, idx, queue=q)
            after = q.run(lambda: "after")
            assert isinstance(taken, (ea.JobFuture, ea.TrioJobFuture))
            taken.add_done_callback(lambda _f: order.append("take"))  # resolution order is run order
            after.add_done_callback(lambda _f: order.append("after"))
            gate.open()
            assert_same(await taken, [1, 2, 3])
            await after
            await anyio.sleep(0)
            assert order == ["take", "after"]
            bad = ea.ops.take(a, mx.array([0, 10]), queue=q)
            follow = q.run(lambda: "still works")
            with pytest.raises(ea.MLXIndexError):
                await bad
            assert await follow == "still works"
        finally:
            ea.ops.set_bounds_checks(previous)


@on_every_loop
async def test_cancelled_job_in_the_backlog_never_runs():
    async with ea.Runtime(max_pending=1) as runtime:
        q = runtime.default_queue()
        gate, ran = Gate(), []
        first = q.run(gate)
        waiting = q.run(ran.append, "waiting")
        last = q.run(ran.append, "last")
        waiting.cancel()
        gate.open()
        await first
        await last
        assert ran == ["last"]
        assert q.pending == 0


# ---- donation ---------------------------------------------------------------------

def _kv_inputs():
    q = mx.ones((1, 1, 2, 4))
    k = mx.full((1, 1, 2, 4), 2.0)
    v = mx.full((1, 1, 2, 4), 3.0)
    k_cache = mx.arange(1 * 6 * 2 * 4, dtype=mx.float32).reshape(1, 6, 2, 4)
    v_cache = -mx.arange(1 * 6 * 2 * 4, dtype=mx.float32).reshape(1, 6, 2, 4)
    mx.eval(q, k, v, k_cache, v_cache)
    return q, k, v, k_cache, v_cache


@on_every_loop
async def test_failed_donated_job_leaves_the_callers_arrays_intact():
    async with ea.Runtime(pool_size=4):
        q, k, v, k_cache, v_cache = _kv_inputs()
        before_k, before_v = np.array(k_cache), np.array(v_cache)
        with pytest.raises(ea.MLXValueError, match="exceed the cache length"):
            await ea.attention.kv_cache_attention(q, k, v, k_cache, v_cache, offset=6, scale=0.5, donate=True)
        assert k_cache.shape == (1, 6, 2, 4) and v_cache.shape == (1, 6, 2, 4)
        assert_same(k_cache, before_k)
        assert_same(v_cache, before_v)


@on_every_loop
async def test_cancelled_or_dropped_donated_job_leaves_the_callers_arrays_intact():
    runtime = ea.Runtime()
    queue = runtime.default_queue()
    q, k, v, k_cache, v_cache = _kv_inputs()
    before_k = np.array(k_cache)
    gate = Gate()
    queue.run(gate)
    await started(gate)
    cancelled = ea.attention.kv_cache_attention(q, k, v, k_cache, v_cache, offset=0, scale=0.5, donate=True,
                                                queue=queue)
    assert cancelled.cancel()
    assert_same(k_cache, before_k)  # handed back when the queued job was removed
    dropped = ea.attention.kv_cache_attention(q, k, v, k_cache, v_cache, offset=0, scale=0.5, donate=True,
                                              queue=queue)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: runtime.close(cancel_pending=True))
        await anyio.sleep(0.01)
        gate.open()
    with pytest.raises(ea.QueueClosed):
        await dropped
    assert k_cache.shape == (1, 6, 2, 4)
    assert_same(k_cache, before_k)


@on_every_loop
async def test_donated_job_whose_awaiter_gave_up_still_updates_the_callers_arrays():
    async with ea.Runtime(pool_size=4) as rt:
        queue = rt.default_queue()
        q, k, v, k_cache, v_cache = _kv_inputs()
        gate = Gate()

        def hold():
            gate()

        queue.run(hold)
        await started(gate)
        future = ea.attention.kv_cache_attention(q, k, v, k_cache, v_cache, offset=2, scale=0.5, donate=True,
                                                 queue=queue)
        gate.open()
        time.sleep(0.2)  # block the loop: the worker takes the job and finishes it unreported
        assert future.cancel()  # too late to drop it: the awaiter gives up, the job ran
        await queue.synchronize()
        assert k_cache.shape == (1, 6, 2, 4)
        assert_same(k_cache[:, 2], np.full((1, 2, 4), 2.0))  # the update happened


# ---- pool hand-back ----------------------------------------------------------------

@on_every_loop
async def test_double_release_is_an_error_and_never_shares_a_queue():
    async with ea.Runtime(pool_size=4) as rt:
        q = await rt.acquire_queue()
        rt.release_queue(q)
        with pytest.raises(ea.QueueReleaseError, match="released twice"):
            rt.release_queue(q)
        a = await rt.acquire_queue()
        b = await rt.acquire_queue()
        assert a is not b
        rt.release_queue(a)
        rt.release_queue(b)


@on_every_loop
async def test_releasing_a_queue_the_pool_never_lent_is_an_error():
    async with ea.Runtime(pool_size=4) as rt:
        with pytest.raises(ea.QueueReleaseError):
            rt.release_queue(rt.default_queue())


# ---- errors: the host callback's exception by identity ------------------------------

@on_every_loop
async def test_each_failed_graph_carries_its_own_callbacks_exception():
    async with ea.Runtime(pool_size=4) as rt:
        raised: dict[str, Exception] = {}

        def failing(tag):
            def fn(a):
                raised[tag] = ValueError("(host call request 1)")  # text that would fool a message match
                raise raised[tag]
            return fn

        x = mx.ones(2)
        mx.eval(x)
        q1, q2 = await rt.acquire_queue(), await rt.acquire_queue()
        try:
            def graph(tag):
                out, = ea.host_call(failing(tag), x, outputs=[((2,), mx.float32)])
                return out

            futures = [q1.run(graph, "one"), q2.run(graph, "two")]
            results = []
            for future in futures:
                with pytest.raises(RuntimeError) as info:
                    await future
                results.append(info.value)
            for tag, error in zip(("one", "two"), results):
                assert isinstance(error, RuntimeError)  # MLX's own, raised by mx.eval in the job
                assert error.__cause__ is raised[tag]
        finally:
            rt.release_queue(q1)
            rt.release_queue(q2)


@on_every_loop
async def test_workers_are_all_handed_back():
    async with ea.Runtime() as runtime:
        await runtime.default_queue().run(lambda: 1)
    assert testing.active_workers() == 0


@on_every_loop
async def test_a_dropped_result_is_freed_at_once():
    import weakref

    async with ea.Runtime() as rt:
        out = await ea.ops.add(mx.ones(3), 1.0, queue=rt.default_queue())
        ref = weakref.ref(out)
        import gc

        gc.disable()  # freed by reference counting, not by a collector pass
        try:
            del out
            await anyio.sleep(0)  # asyncio holds the step's handle (and its future) until the step ends
            assert ref() is None  # no future <-> job cycle keeps it alive
        finally:
            gc.enable()


# ---- one bad job never takes others down ------------------------------------------------

async def _batch_behind_a_gate(q, bad_job):
    """`bad_job()` and twenty unrelated jobs, all finishing in one drained batch."""
    gate = Gate()
    blocker = q.run(gate)
    await started(gate)
    bad = bad_job()
    others = [q.run(lambda i=i: i) for i in range(20)]
    gate.open()
    time.sleep(0.3)  # the loop is held: every record is waiting when the drain runs
    await blocker
    return bad, others


@on_every_loop
async def test_a_job_whose_publish_step_raises_fails_alone(rt, monkeypatch):
    from emlx_async import _queue

    real = _queue._published

    def published(job, payload):
        if job.op_name == "subtract":
            real(job, payload)  # the payload is consumed; then the step fails, as a bad index would
            raise IndexError("list index out of range (injected)")
        return real(job, payload)

    monkeypatch.setattr(_queue, "_published", published)
    q = rt.default_queue()
    bad, others = await _batch_behind_a_gate(q, lambda: ea.ops.subtract(mx.ones(3), 1.0, queue=q))
    with anyio.fail_after(20):
        with pytest.raises(IndexError, match="injected"):
            await bad
        assert [await f for f in others] == list(range(20))
        assert (await ea.ops.add(mx.ones(2), 1.0, queue=q)).tolist() == [2.0, 2.0]
    stats = q.stats()
    assert stats.failed == 1 and stats.in_flight == 0


@on_every_loop
async def test_an_error_while_finishing_a_job_fails_that_job_and_the_drain_goes_on(rt, monkeypatch):
    from emlx_async import _queue

    real = _queue.CommandQueue._finish
    poisoned: set = set()

    def finish(self, job, *args, **kwargs):
        if job.id in poisoned:
            raise RuntimeError("finishing failed (injected)")
        return real(self, job, *args, **kwargs)

    monkeypatch.setattr(_queue.CommandQueue, "_finish", finish)
    q = rt.default_queue()

    def bad_job():
        future = q.run(lambda: "bad")
        poisoned.add(future._job.id)
        return future

    bad, others = await _batch_behind_a_gate(q, bad_job)
    with anyio.fail_after(20):
        with pytest.raises(RuntimeError, match="injected"):
            await bad
        assert [await f for f in others] == list(range(20))


@on_every_loop
async def test_a_refused_native_call_raises_the_class_of_its_error_kind():
    async with ea.Runtime(pool_size=4) as rt:
        q = await rt.acquire_queue()
        lib = _native.lib
        assert lib.emlx_worker_release(q._worker, 10**12, 0) == 0
        assert lib.emlx_worker_release(q._worker, 10**12 + 1, 0) == -1
        assert lib.emlx_last_error_kind() == lib.EMLX_ERR_CLOSED
        with pytest.raises(ea.RuntimeClosed, match="already released"):
            _native.ensure(lib.emlx_worker_release(q._worker, 10**12 + 2, 0))
        with pytest.raises(ea.QueueClosed, match="stopping"):
            await q.run(lambda: 1)  # the worker refuses it: the queue is closing
        for _ in range(500):
            if testing.active_workers() == 0:
                break
            await anyio.sleep(0.01)
        rt.release_queue(q)
