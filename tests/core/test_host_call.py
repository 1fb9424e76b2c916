"""Host calls: graph nodes whose evaluation runs a callback on the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio

import mlx.core as mx
import numpy as np
import pytest
import uvloop

import emlx_async as ea
from support.helpers import Awaiter, on_every_loop


def np_of(x):
    return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)


@on_every_loop
async def test_loop_level_host_call_then_eval():
    async with ea.Runtime(pool_size=4) as rt:
        seen = {}

        def double(x):
            seen["thread"] = threading.get_ident()
            return x * 2

        x = mx.arange(6, dtype=mx.float32).reshape(2, 3)
        y, = await ea.host_call(double, x, outputs=[((2, 3), mx.float32)])
        assert rt.queue_of(y) is not None  # lazy, owned by its queue
        await ea.eval(y)
        np.testing.assert_array_equal(np.array(y), np.arange(6).reshape(2, 3) * 2)
        assert seen["thread"] == threading.get_ident()  # ran on the loop thread


@on_every_loop
async def test_async_callback_inside_run_with_several_calls_and_outputs():
    async with ea.Runtime(pool_size=4) as rt:
        async def split_stats(x):
            await anyio.sleep(0.001)
            return x.sum(), x.max(keepdims=True)

        def add_one(x):
            return np.asarray(x) + 1

        def graph(a):
            s, m = ea.host_call(split_stats, a, outputs=[((), mx.float32), ((1,), mx.float32)])
            b, = ea.host_call(add_one, a * 3, outputs=[(a.shape, a.dtype)])
            return s + m[0], b

        a = mx.arange(4, dtype=mx.float32)
        async with rt.queue() as q:
            total, b = await q.run(graph, a)
        assert total.item() == 6 + 3
        np.testing.assert_array_equal(np.array(b), np.arange(4) * 3 + 1)


@on_every_loop
async def test_inputs_arrive_whole_whatever_the_layout():
    async with ea.Runtime(pool_size=4) as rt:
        for dtype in [mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.bool_]:
            await _check_layouts(rt, dtype)


async def _check_layouts(rt, dtype):
    base = mx.arange(24).reshape(4, 6).astype(dtype)
    views = {
        "transposed": base.T,
        "sliced": base[1:, ::2],
        "broadcast": mx.broadcast_to(base[:1], (3, 6)),
    }
    received = {}

    def capture(name):
        def fn(x):
            received[name] = np_of(x).copy()
            return x
        return fn

    def graph(**xs):
        return [ea.host_call(capture(k), v, outputs=[(v.shape, v.dtype)])[0] for k, v in xs.items()]

    outs = await rt.default_queue().run(graph, **views)
    for (name, view), out in zip(views.items(), outs):
        np.testing.assert_array_equal(received[name], np_of(view), err_msg=f"{name} {dtype}")
        np.testing.assert_array_equal(np_of(out), np_of(view), err_msg=f"{name} {dtype}")


@on_every_loop
async def test_scalar_and_empty_outputs():
    async with ea.Runtime(pool_size=4) as rt:
        def fn(x):
            return mx.array(7, dtype=mx.int32), mx.zeros((0, 3))

        s, e = await rt.default_queue().run(
            lambda x: ea.host_call(fn, x, outputs=[((), mx.int32), ((0, 3), mx.float32)]), mx.ones(2))
        assert s.item() == 7 and e.shape == (0, 3)


@on_every_loop
async def test_host_calls_never_evaluated_leave_no_callback_behind():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        x = mx.ones((2, 3))
        for _ in range(50):  # each kept its callback on the loop for ever
            y, = await ea.host_call(lambda a: a, x, outputs=[((2, 3), mx.float32)], queue=q)
            del y
        calls = q._channel.host_server.calls
        with anyio.fail_after(10):
            while calls:  # the freed nodes' records arrive through the channel
                await anyio.sleep(0.01)
        y, = await ea.host_call(lambda a: a + 1, x, outputs=[((2, 3), mx.float32)], queue=q)
        await ea.eval(y)  # an evaluated one is served, then gone too
        assert y.tolist() == [[2.0] * 3] * 2
        del y
        with anyio.fail_after(10):
            while calls:
                await anyio.sleep(0.01)


@pytest.mark.parametrize("outputs, cls, words", [
    (5, ea.MLXValueError, "needs outputs="),  # was TypeError: 'int' object is not iterable
    (None, ea.MLXValueError, "needs outputs="),
    ([((2, 3), [1])], ea.MLXValueError, "unsupported dtype"),  # was TypeError: unhashable type: 'list'
    ([((2, 3), "float32")], ea.MLXValueError, "unsupported dtype"),
    ([((2,),)], ea.MLXValueError, "must be a \\(shape, dtype\\) pair"),
    ([((2, -3), mx.float32)], ea.MLXValueError, "negative dimension"),
    ([((10**12,), mx.float32)], ea.MLXOverflowError, "int32 dimensions"),
])
def test_bad_output_specs_are_refused_by_name_with_emlx_errors(outputs, cls, words):
    with pytest.raises(cls, match=words):
        ea.host_call(lambda a: a, mx.ones((2, 3)), outputs=outputs)
    with pytest.raises(ea.InvalidInputType, match="input 0 is str"):
        ea.host_call(lambda a: a, "x", outputs=[((2, 3), mx.float32)])


@on_every_loop
async def test_raising_callback_fails_the_graph_with_chained_cause():
    async with ea.Runtime(pool_size=4) as rt:
        class FilterError(Exception):
            pass

        def bad(x):
            raise FilterError("vocabulary file missing")

        q = rt.default_queue()
        with pytest.raises(ea.MLXRuntimeError, match=r"\[host_call\] .*bad raised FilterError") as info:
            await q.run(lambda x: ea.host_call(bad, x, outputs=[((2,), mx.float32)]), mx.ones(2))
        assert isinstance(info.value.__cause__, FilterError)
        y, = await ea.host_call(bad, mx.ones(2), outputs=[((2,), mx.float32)], queue=q)
        with pytest.raises(ea.MLXRuntimeError) as info:
            await ea.eval(y)
        assert isinstance(info.value.__cause__, FilterError)
        assert await q.run(lambda: 5) == 5  # the queue keeps working


class _Stop(BaseException):
    """A callback's own BaseException that is not an Exception."""


@on_every_loop
@pytest.mark.parametrize("error_cls", [_Stop, GeneratorExit])
async def test_a_callback_raising_a_bare_base_exception_fails_the_graph_at_once(error_cls):
    async with ea.Runtime(pool_size=4) as rt:
        raised = error_cls("from callback")

        def stop(x):
            raise raised

        q = rt.default_queue()
        with anyio.fail_after(5):  # unanswered, the worker would wait for its backstop (12 s)
            with pytest.raises(RuntimeError, match=f"stop raised {error_cls.__name__}") as info:
                await q.run(lambda x: ea.host_call(stop, x, outputs=[((2,), mx.float32)], timeout=1)[0] * 2,
                            mx.ones(2))
            assert info.value.__cause__ is raised
            assert await q.run(lambda: 5) == 5  # the queue keeps working


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("error_cls", [KeyboardInterrupt, SystemExit])
def test_under_asyncio_a_callbacks_system_exit_ends_the_run_and_the_worker_is_answered(loop, error_cls):
    """asyncio's rule for a task's KeyboardInterrupt or SystemExit: it leaves the loop's run.
    The request is answered first, so the loop, run again, finds the queue free at once."""
    raised, seen = error_cls(), []

    def interrupt(x):
        raise raised

    async def main():
        q = ea.get_runtime().default_queue()
        try:
            await q.run(lambda x: ea.host_call(interrupt, x, outputs=[((2,), mx.float32)], timeout=1)[0] * 2,
                        mx.ones(2))
        except RuntimeError as exc:
            seen.append(exc)

    async def first():
        # main in a task of its own: were the run's own future to finish in the iteration the
        # exception leaves, its stop() would linger into the next run (uvloop).
        tasks.append(asyncio.create_task(main()))
        await asyncio.sleep(5)  # the callback's exception ends the run first

    async def after():
        with anyio.fail_after(5):  # unanswered, the worker would wait for its backstop (12 s)
            while not seen:
                await asyncio.sleep(0.001)
            return await ea.get_runtime().default_queue().run(lambda: 5)

    tasks = []
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        with pytest.raises(error_cls) as info:
            runner.run(first())
        assert info.value is raised
        assert runner.run(after()) == 5
        assert len(seen) == 1 and seen[0].__cause__ is raised


@on_every_loop
async def test_wrong_output_shape_or_dtype_is_rejected():
    async with ea.Runtime(pool_size=4) as rt:
        q = rt.default_queue()
        with pytest.raises(RuntimeError, match=r"output 0 must be \(3,\) mlx.core.float32, got \(2,\)"):
            await q.run(lambda x: ea.host_call(lambda v: v, x, outputs=[((3,), mx.float32)]), mx.ones(2))
        with pytest.raises(RuntimeError, match="expected 2 outputs, got 1"):
            await q.run(lambda x: ea.host_call(lambda v: v, x, outputs=[((2,), mx.float32)] * 2), mx.ones(2))
        with pytest.raises(ValueError, match=r"outputs\[0\] must be a \(shape, dtype\) pair"):
            ea.host_call(lambda v: v, mx.ones(2), outputs=[(2,)])
        # What mlx makes no array of (these gave std::bad_cast or nanobind's list of overloads)
        for value, says in ((np.array(["a", "b"]), r"\(ndarray\) is not an array: Invalid type ndarray"),
                            (np.array([object(), 1]), r"\(ndarray\) is not an array"),
                            (None, r"\(NoneType\) is not an array$")):
            with pytest.raises(RuntimeError, match=r"\[host_call\] output 0 " + says):
                await q.run(lambda x: ea.host_call(lambda v: value, x, outputs=[((2,), mx.float32)]), mx.ones(2))
        # NumPy's other byte order is read as its values (mlx fails on it)
        swapped, = await q.run(lambda x: ea.host_call(lambda v: np.array([3.0, 4.0], dtype=">f4"), x,
                                                      outputs=[((2,), mx.float32)]), mx.ones(2))
        assert swapped.tolist() == [3.0, 4.0]
        assert await q.run(lambda: "ok") == "ok"


@on_every_loop
async def test_timeout_turns_a_stuck_callback_into_an_error():
    async with ea.Runtime(pool_size=4) as rt:
        async def stuck(x):
            await anyio.sleep(30)

        q = rt.default_queue()
        with pytest.raises(RuntimeError, match="timed out after 0.1s") as info:
            await q.run(lambda x: ea.host_call(stuck, x, outputs=[((1,), mx.float32)], timeout=0.1), mx.ones(1))
        assert isinstance(info.value.__cause__, TimeoutError)
        assert await q.run(lambda: 1) == 1


@on_every_loop
async def test_default_timeout_from_the_runtime():
    async with ea.Runtime(host_call_timeout=0.05) as runtime:
        async def stuck(x):
            await anyio.sleep(30)

        y, = await ea.host_call(stuck, mx.ones(1), outputs=[((1,), mx.float32)],
                                queue=runtime.default_queue())
        with pytest.raises(ea.MLXRuntimeError, match="timed out after 0.05s"):
            await ea.eval(y)


@on_every_loop
async def test_a_timeout_out_of_range_names_its_option_and_inf_means_no_limit():
    # The worker's backstop (2 * timeout + 10 s, in ms) is a C int: an unchecked 3e6 or inf overflowed it.
    allowed = r"must be seconds in \(0, 1000000\]"
    for bad in (3e6, float("nan"), 0, -1.0):
        with pytest.raises(ValueError, match=f"^host_call_timeout {allowed}"):
            ea.Runtime(host_call_timeout=bad)
    with pytest.raises(TypeError, match="^host_call_timeout must be"):
        ea.Runtime(host_call_timeout="30")
    async with ea.Runtime(pool_size=2, host_call_timeout=float("inf")) as rt:
        q = rt.default_queue()
        for bad in (3e6, float("nan"), 0):
            with pytest.raises(ValueError, match=f"^timeout {allowed}"):
                ea.host_call(lambda v: v, mx.ones(2), outputs=[((2,), mx.float32)], timeout=bad, queue=q)

        def tripled(x, timeout):
            return ea.host_call(lambda v: v * 3, x, outputs=[((2,), mx.float32)], timeout=timeout)[0]

        with anyio.fail_after(10):
            for timeout in (None, float("inf"), 1e6):  # None: the runtime's inf
                assert (await q.run(tripled, mx.ones(2), timeout)).tolist() == [3.0, 3.0]


@on_every_loop
async def test_cancelling_the_awaiter_cancels_the_callback_and_unblocks_the_worker():
    async with ea.Runtime(pool_size=4) as rt:
        started, finished = anyio.Event(), []

        async def slow(x):
            started.set()
            try:
                await anyio.sleep(30)
            finally:
                finished.append("callback ended")
            return x

        q = rt.default_queue()
        async with anyio.create_task_group() as tg:
            job = Awaiter(tg, q.run(lambda x: ea.host_call(slow, x, outputs=[((1,), mx.float32)]), mx.ones(1)))
            with anyio.fail_after(10):
                await started.wait()
            job.cancel()
        assert job.outcome == "cancelled"
        with anyio.fail_after(10):
            assert await q.run(lambda: "free") == "free"
        assert finished == ["callback ended"]


@on_every_loop
async def test_cancelled_while_its_outputs_are_prepared_the_callback_still_answers_the_worker():
    """The callback has returned; its lazy output waits behind another queue's job when the
    awaiter gives up. The request must still be answered, or the worker stays blocked."""
    async with ea.Runtime(pool_size=4) as rt, rt.queue() as other:
        q = rt.default_queue()
        assert other is not q
        owned_elsewhere = await other.run(lambda: mx.ones(1) * 5, lazy=True)
        returned = anyio.Event()

        def gives_a_lazy_output(x):
            returned.set()
            return owned_elsewhere  # its evaluation queues behind `other`'s sleep

        async with anyio.create_task_group() as tg:
            busy = Awaiter(tg, other.run(time.sleep, 3))
            job = Awaiter(tg, q.run(lambda x: ea.host_call(gives_a_lazy_output, x, outputs=[((1,), mx.float32)]),
                                    mx.ones(1)))
            with anyio.fail_after(10):
                await returned.wait()
            await anyio.sleep(0.2)  # the server now awaits the output's evaluation
            job.cancel()
            with anyio.fail_after(2):  # well before `other` is free again
                assert await q.run(lambda: "free") == "free"
        assert job.outcome == "cancelled" and busy.outcome == ("ok", None)


@on_every_loop
async def test_callback_mlx_work_uses_the_callback_queue():
    async with ea.Runtime(pool_size=4) as rt:
        q = rt.default_queue()

        async def uses_mlx(x):
            assert ea.current_queue() is rt.callback_queue()
            return await ea.run(lambda v: v + 10, x)  # would deadlock on q; goes to the callback queue

        out, = await q.run(lambda x: ea.host_call(uses_mlx, x, outputs=[((2,), mx.float32)]), mx.zeros(2))
        np.testing.assert_array_equal(np.array(out), [10, 10])


@on_every_loop
async def test_awaiting_the_blocked_queue_is_a_clear_error():
    async with ea.Runtime(pool_size=4) as rt:
        q = rt.default_queue()

        async def awaits_own_queue(x):
            return await q.run(lambda: x)

        with pytest.raises(RuntimeError, match=r"HostCallDeadlock: a host callback awaited") as info:
            await q.run(lambda x: ea.host_call(awaits_own_queue, x, outputs=[((1,), mx.float32)]), mx.ones(1))
        assert isinstance(info.value.__cause__, ea.HostCallDeadlock)
        assert await q.run(lambda: 2) == 2


@on_every_loop
async def test_callbacks_on_several_queues_proceed_concurrently():
    async with ea.Runtime(pool_size=4) as rt:
        arrived, both_waiting = [], anyio.Event()

        async def meet(x):
            arrived.append(1)
            if len(arrived) == 2:
                both_waiting.set()
            with anyio.fail_after(10):
                await both_waiting.wait()  # needs the other queue's callback too
            return x

        results = []

        async def one():
            async with rt.queue() as q:
                results.append(await q.run(lambda x: ea.host_call(meet, x, outputs=[((1,), mx.float32)]),
                                           mx.ones(1)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        (a,), (b,) = results
        assert a.item() == b.item() == 1.0
