"""The runtime under trio (and anyio's trio backend): cancel scopes, nurseries,
host callbacks that await trio, the implicit runtime's life.

Each test drives its own ``trio.run``; the leak checks of conftest apply.
"""

from __future__ import annotations

import re
import time

import anyio
import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async import testing
from support import ROOT
from support.helpers import Gate, needs_model, run_python

trio = pytest.importorskip("trio")


async def _wait_started(gate: Gate) -> None:
    deadline = time.monotonic() + 10
    while not gate.started.is_set():
        assert time.monotonic() < deadline, "job never started"
        await trio.sleep(0.001)


README = ROOT / "README.md"


def readme_tour_blocks() -> list[str]:
    """The README's Tour code blocks, as written: the example, then the lines that run it under trio."""
    tour = README.read_text().split("\n## Tour\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", tour, re.S)[:2]


def test_the_readme_tour_runs_unchanged_under_asyncio_trio_run_and_anyio_trio(capsys):
    example, under_trio = readme_tour_blocks()
    assert "asyncio.run(main())" in example and "trio.run(main)" in under_trio
    assert 'anyio.run(main, backend="trio")' in under_trio
    namespace: dict = {}
    exec(compile(example, "README.md (Tour)", "exec"), namespace)  # runs it with asyncio.run
    exec(compile(under_trio, "README.md (Tour, trio)", "exec"), namespace)  # trio.run, then anyio.run on trio
    printed = capsys.readouterr().out.splitlines()
    # print(v, x): the sum of (ones @ ones.T) and arange(10) * 2, once per run.
    assert len(printed) == 3 and len(set(printed)) == 1, printed
    total, array = printed[0].split(" ", 1)
    assert float(total) == 64.0 * 64 * 64
    assert array == "array([0, 2, 4, ..., 14, 16, 18], dtype=int32)", array  # MLX elides ten elements
    assert testing.active_workers() == 0


def test_ops_host_calls_and_errors_under_trio():
    async def main():
        async with ea.Runtime() as rt:
            a = mx.arange(6, dtype=mx.float32).reshape(2, 3)
            s = await ea.ops.sum(a, axis=1)
            np.testing.assert_array_equal(np.array(s), [3.0, 12.0])

            async def double_later(x):
                await trio.sleep(0.01)  # a trio callback may await trio things
                return x * 2

            out, = await ea.host_call(double_later, a, outputs=[((2, 3), mx.float32)])
            np.testing.assert_array_equal(np.array(await ea.eval(out)), np.array(a) * 2)
            with pytest.raises(ea.MLXValueError, match=r"\[matmul\]"):
                await ea.ops.matmul(a, a)
            with pytest.raises(ZeroDivisionError):
                await rt.default_queue().run(lambda: 1 / 0)
            assert await rt.default_queue().run(lambda: "still works") == "still works"

    trio.run(main)


def test_cancel_scope_drops_a_queued_job_and_releases_a_running_one():
    async def main():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            gate, ran = Gate(), []
            with trio.move_on_after(0.05) as scope:
                await q.run(gate, "running")  # running when the scope fires
            assert scope.cancelled_caught
            assert gate.started.is_set()
            with trio.move_on_after(0.02) as scope:
                await q.run(ran.append, "queued")  # behind the gate when the scope fires
            assert scope.cancelled_caught
            after = q.run(ran.append, "after")
            gate.open()
            await after
            assert ran == ["after"]  # the cancelled queued job never ran
            assert q.pending == 0

    trio.run(main)


def test_fail_after_around_an_op_raises_timeout_and_the_queue_goes_on():
    async def main():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            gate = Gate()
            blocked = q.run(gate)
            await _wait_started(gate)
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.02):
                    await ea.ops.add(mx.ones(2), 1.0, queue=q)
            gate.open()
            await blocked
            np.testing.assert_array_equal(np.array(await ea.ops.add(mx.ones(2), 1.0, queue=q)), [2.0, 2.0])

    trio.run(main)


def test_an_awaiting_task_drains_the_channel_itself_and_wakes_for_a_settle_from_elsewhere():
    """One awaiting task at a time waits on the completion fd itself (the watcher parks off it).

    A future that another task settles (here: cancels) while that task waits
    must wake it at once, though no record arrives: without the channel's
    signal it would wait until the gated job ends, past fail_after.
    """
    async def main():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            wake = rt._backend._wake
            gate = Gate()
            blocked = q.run(gate, "gated")
            await _wait_started(gate)
            outcome = []

            async def waiter():
                try:
                    await blocked
                except ea.CancelledJob:  # its job was cancelled by another task
                    outcome.append("cancelled")

            with anyio.fail_after(5):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(waiter)
                    while wake.future is not blocked:  # the waiter waits on the fd, not parked
                        await trio.sleep(0.001)
                    second = q.eval(mx.ones(3))  # a second awaiter parks and is woken by the first one's drain
                    nursery.start_soon(lambda: second)
                    await trio.sleep(0.01)
                    blocked.cancel()  # settled by this task, not by a drain
                    while not outcome:
                        await trio.sleep(0.001)
                    assert not second.done()  # behind the gated job, which still runs
                    gate.open()
            assert outcome == ["cancelled"]
            assert wake.future is None
            assert second.done()
            np.testing.assert_array_equal(np.array(await q.eval(mx.ones(2))), [1.0, 1.0])  # the watcher is back
            results = []

            async def job(i):
                results.append(await ea.ops.add(mx.ones(2), float(i), queue=q))

            with anyio.fail_after(10):
                async with trio.open_nursery() as nursery:  # many awaiters: one on the fd, the rest parked
                    for i in range(20):
                        nursery.start_soon(job, i)
            assert sorted(float(r[0]) for r in results) == [1.0 + i for i in range(20)]

    trio.run(main)


def test_a_job_two_tasks_await_is_cancelled_for_both_when_one_is_cancelled_as_under_asyncio():
    """asyncio's rule: a cancelled awaiter cancels the future, and the other awaiter gets
    CancelledError. Under trio the other gets ea.CancelledJob, never asyncio.CancelledError
    (a BaseException that would crash its nursery)."""
    async def main():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            gate = Gate()
            shared = q.run(gate, "never seen")
            await _wait_started(gate)
            outcome = {}

            async def waiter(tag, patience):
                try:
                    with trio.move_on_after(patience) as scope:
                        outcome[tag] = await shared
                    if scope.cancelled_caught:
                        outcome[tag] = "its own cancel"
                except ea.CancelledJob:
                    outcome[tag] = "CancelledJob"

            try:
                with trio.fail_after(5):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(waiter, "short", 0.05)
                        nursery.start_soon(waiter, "long", 30)
            finally:
                gate.open()
            assert outcome == {"short": "its own cancel", "long": "CancelledJob"}
            assert shared.cancelled()
            with pytest.raises(ea.CancelledJob):
                await shared  # a later awaiter, too
            with pytest.raises(ea.CancelledJob):
                shared.result()
            assert await q.run(lambda: 5) == 5

    trio.run(main)


@pytest.mark.parametrize("error_cls", [KeyboardInterrupt, SystemExit])
def test_a_callbacks_keyboard_interrupt_or_system_exit_reaches_the_awaiter_not_trio_internals(error_cls):
    """A callback runs in a trio system task, which must not raise (trio.run would raise
    TrioInternalError): the request is answered and the job's awaiter raises it instead."""
    raised = error_cls()

    def interrupt(x):
        raise raised

    async def main():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            with trio.fail_after(5):  # the worker's backstop (12 s) must not be what answers
                with pytest.raises(error_cls) as info:
                    await q.run(lambda x: ea.host_call(interrupt, x, outputs=[((2,), mx.float32)], timeout=1)[0] * 2,
                                mx.ones(2))
                assert info.value is raised
                assert await q.run(lambda: 5) == 5  # the queue keeps working

    try:
        trio.run(main)
    except (KeyboardInterrupt, SystemExit) as exc:  # would end pytest's session
        pytest.fail(f"{exc!r} left trio.run instead of reaching the awaiter")


def test_a_background_task_raising_a_bare_base_exception_is_printed_not_a_trio_internal_error(capsys):
    """rt.start_soon's task is a trio system task: what it raises is printed, as asyncio's
    handler would report it; raised there, trio.run would raise TrioInternalError."""
    class Stop(BaseException):
        pass

    async def stop():
        raise Stop("from a background task")

    async def main():
        async with ea.Runtime() as rt:
            rt.start_soon(stop)
            await trio.sleep(0.01)
            assert await rt.default_queue().run(lambda: 5) == 5

    trio.run(main)
    assert "Stop: from a background task" in capsys.readouterr().err


def test_the_watcher_sleeps_through_awaited_round_trips_and_still_reads_unawaited_completions():
    """After an awaited round trip with nothing left in flight the watcher stays parked (its step
    per round trip is saved); a job nobody awaits must still complete: its submission arms the
    parked watcher's deadline, and past it the watcher reads the channel again."""
    async def main():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            wake = rt._backend._wake
            with anyio.fail_after(10):
                for _ in range(50):
                    await q.eval(mx.ones(2))
                await trio.sleep(0.05)  # let a deadline a submission armed pass, if any
                for _ in range(1000):  # parks in the first round trip whose record it sees first
                    await q.eval(mx.ones(2))
                    if wake._parked_watcher is not None:
                        break
                assert wake._parked_watcher is not None  # and stays parked: nothing is in flight
                done = trio.Event()
                unawaited = q.run(lambda: 5)
                unawaited.add_done_callback(lambda _: done.set())  # nobody waits on the fd
                await done.wait()
                assert unawaited.result() == 5
                # The watcher watches the fd again, and the next awaiter takes it over as before.
                assert wake._parked_watcher is None
                assert (await ea.ops.add(mx.ones(2), 1.0, queue=q)).tolist() == [2.0, 2.0]

    trio.run(main)


def test_bindings_are_inherited_by_nursery_children():
    async def main():
        async with ea.Runtime(pool_size=2) as rt:
            seen = {}

            async def child(name):
                seen[name] = ea.current_queue()

            async with rt.queue() as q:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(child, "bound")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child, "unbound")
            assert seen["bound"] is q
            assert seen["unbound"] is rt.default_queue()

    trio.run(main)


def test_concurrent_jobs_from_a_nursery_on_several_queues():
    async def main():
        async with ea.Runtime(pool_size=4) as rt:
            results = {}

            async def worker(i):
                async with rt.queue() as q:
                    results[i] = await q.run(lambda: (mx.ones((32, 32)) * i).sum().item())

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(worker, i)
            assert results == {i: 1024.0 * i for i in range(8)}

    trio.run(main)


def test_the_implicit_runtime_closes_at_the_end_of_trio_run():
    async def main():
        rt = ea.get_runtime()
        assert await ea.ops.add(mx.ones(1), 1.0) is not None
        assert testing.active_workers() >= 1
        return rt

    rt = trio.run(main)
    assert rt.closed
    assert testing.active_workers() == 0


def test_keyboard_interrupt_during_a_running_job_ends_the_run():
    result = run_python("""
        import signal, threading, time
        import trio
        import emlx_async as ea

        async def main():
            async with ea.Runtime() as rt:
                threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGINT)).start()
                await rt.default_queue().run(time.sleep, 2.0)

        # A child started in the background inherits SIGINT ignored (POSIX shells do that to `cmd &`):
        # then Python installs no handler, trio none either, and the signal is dropped.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            trio.run(main)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "interrupted" in result.stdout


@pytest.mark.model
@needs_model
@pytest.mark.parametrize("mode", ["parallel", "batch"])
def test_a_nursery_of_concurrent_decode_streams_gives_the_greedy_tokens_of_each_alone(mode):
    from emlx_async.llm import Engine

    prompts = [[1, 2, 3, 4 + i] for i in range(8)]  # short token-id prompts: the template is not the point

    async def tokens(engine, prompt):
        return [d.token async for d in engine.generate(prompt=prompt, max_tokens=3, temperature=0.0)
                if d.token is not None]

    async def main():
        async with ea.Runtime(pool_size=4) as rt:
            engine = await Engine.load(runtime=rt, max_concurrent=8, mode=mode)
            alone = [await tokens(engine, p) for p in prompts]
            together: dict[int, list[int]] = {}

            async def one(i):
                together[i] = await tokens(engine, prompts[i])

            async with trio.open_nursery() as nursery:
                for i in range(len(prompts)):
                    nursery.start_soon(one, i)
            assert [together[i] for i in range(len(prompts))] == alone
            # A cancelled stream frees its slot and queue: the engine goes on.
            with trio.move_on_after(0.01):
                await tokens(engine, prompts[0])
            assert await tokens(engine, prompts[0]) == alone[0]

    trio.run(main)
