"""rt.stats() / q.stats(): per-queue job counters, wait and run time, busy fraction."""

from __future__ import annotations

import time

import anyio
import mlx.core as mx
import pytest

import emlx_async as ea
from support.helpers import Awaiter, Gate, on_every_loop, started


def _fail() -> None:
    raise KeyError("planted")


@on_every_loop
async def test_each_job_ends_in_exactly_one_outcome():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        for _ in range(3):
            await q.run(lambda: 1)
        await q.eval(mx.array([1.0, 2.0]))
        with pytest.raises(KeyError):
            await q.run(_fail)
        with pytest.raises(ea.MLXValueError):  # a native failure counts too
            await ea.ops.reshape(mx.arange(6), (4, 2))

        gate = Gate()
        async with anyio.create_task_group() as tg:
            running = Awaiter(tg, q.run(gate))
            await started(gate)
            queued = Awaiter(tg, q.run(lambda: "never"))
            await anyio.sleep(0.01)
            assert q.stats().in_flight == 2
            queued.cancel()      # not started: dropped, never runs
            running.cancel()     # running: abandoned, runs to its end
            await queued.done.wait()
            await running.done.wait()
            gate.open()
        await q.synchronize()

        s = q.stats()
        assert s.name == q.name and s.role == "default"
        assert (s.submitted, s.completed, s.failed, s.cancelled, s.in_flight) == (9, 5, 2, 2, 0)
        # Everything that reached the worker started; the dropped job did not.
        assert s.started == 8
        same = rt.stats().queues[q.name]
        assert (same.submitted, same.started, same.run_time) == (s.submitted, s.started, s.run_time)


@on_every_loop
async def test_wait_and_run_time_come_from_the_worker():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        first = q.run(time.sleep, 0.1)
        second = q.run(time.sleep, 0.05)  # waits for the first on the worker
        await first
        await second
        s = q.stats()
        assert s.started == 2
        assert 0.15 <= s.run_time < 1.0
        # The second job waited at least the first one's run time.
        assert 0.09 <= s.wait_time < 1.0
        assert 0.0 < s.busy_fraction <= 1.0
        assert s.busy_fraction == pytest.approx(s.run_time / s.uptime, rel=0.2)


@on_every_loop
async def test_backlog_jobs_count_as_waiting_then_cancelled_or_dropped():
    async with ea.Runtime(max_pending=1) as rt:
        q = await rt.acquire_queue()
        gate = Gate()
        async with anyio.create_task_group() as tg:
            holding = Awaiter(tg, q.run(gate))
            await started(gate)
            in_backlog = Awaiter(tg, q.run(lambda: "never"))
            await anyio.sleep(0.01)
            in_backlog.cancel()
            await in_backlog.done.wait()
            gate.open()
            await holding.done.wait()
        s = q.stats()
        assert (s.submitted, s.started, s.completed, s.cancelled, s.role) == (2, 1, 1, 1, "pool")

        gate = Gate()
        async with anyio.create_task_group() as tg:
            holding = Awaiter(tg, q.run(gate))
            await started(gate)
            dropped = Awaiter(tg, q.run(lambda: "never"))
            await anyio.sleep(0.01)

            async def close():
                await q.close(cancel_pending=True)

            tg.start_soon(close)
            await dropped.done.wait()
            gate.open()
        assert dropped.outcome[0] == "error" and isinstance(dropped.outcome[1], ea.QueueClosed)
        s = q.stats()
        assert (s.submitted, s.started, s.completed, s.failed, s.in_flight) == (4, 2, 2, 1, 0)
        rt.release_queue(q)


@on_every_loop
async def test_total_keeps_closed_queues_and_outlives_the_runtime():
    async with ea.Runtime() as rt:
        q = await rt.acquire_queue()
        for _ in range(4):
            await q.run(time.sleep, 0.01)
        await q.close()
        rt.release_queue(q)
        fresh = await rt.acquire_queue()
        assert fresh is not q
        await fresh.run(lambda: None)
        rt.release_queue(fresh)
        await rt.default_queue().run(lambda: None)
        stats = rt.stats()
        # The closed queue is only in the total (a new queue may reuse its parked worker and name).
        assert stats.queues[fresh.name].submitted == 1
        assert sum(s.submitted for s in stats.queues.values()) == 2
        assert {s.role for s in stats.queues.values()} == {"pool", "default"}
        assert stats.total.completed == 6 == stats.total.submitted
        assert stats.total.run_time >= 0.04
        assert 0.0 < stats.total.busy_fraction <= 1.0
    after = rt.stats()
    assert after.total.completed == 6
    assert after.total.uptime == rt.stats().total.uptime  # frozen at close


@on_every_loop
async def test_metrics_export_the_queue_counters():
    parser = pytest.importorskip("prometheus_client.parser")
    from emlx_async.serve.metrics import Metrics

    async with ea.Runtime() as rt:
        metrics = Metrics(runtime_stats=rt.stats)
        q = rt.default_queue()
        await q.run(time.sleep, 0.05)
        with pytest.raises(KeyError):
            await q.run(_fail)
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in parser.text_string_to_metric_families(metrics.render().decode())
                   for s in family.samples}
    key = (("queue", q.name), ("role", "default"))
    assert samples[("emlx_queue_busy_seconds_total", key)] >= 0.05
    assert samples[("emlx_queue_wait_seconds_total", key)] >= 0.0
    assert 0 < samples[("emlx_queue_busy_fraction", key)] <= 1
    jobs = {outcome: samples[("emlx_queue_jobs_total", (("outcome", outcome), *key))]
            for outcome in ("submitted", "started", "completed", "failed", "cancelled")}
    assert jobs == {"submitted": 2, "started": 2, "completed": 1, "failed": 1, "cancelled": 0}
