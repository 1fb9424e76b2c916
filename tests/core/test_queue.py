"""Jobs, results, errors and routing, each checked against plain MLX."""

from __future__ import annotations

import re

import anyio

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async import _interop
from support.helpers import on_every_loop, on_loops


def is_evaluated(array: mx.array) -> bool:
    return _interop.array_state(array).state == _interop.AVAILABLE


def reference(fn, *args):
    out = fn(*args)
    mx.eval(out)
    return out


@on_every_loop
async def test_run_returns_evaluated_arrays_equal_to_plain_mlx():
    async with ea.Runtime(pool_size=4) as rt:
        a = mx.random.normal((64, 32), key=mx.random.key(1))
        b = mx.random.normal((32, 16), key=mx.random.key(2))
        mx.eval(a, b)

        def f(x, y, *, scale):
            return {"mm": (x @ y) * scale, "parts": [x.sum(axis=0), (y.max(), "tag")]}

        async with rt.queue() as q:
            out = await q.run(f, a, b, scale=0.5)
        expected = reference(lambda: f(a, b, scale=0.5))
        for got, want in [(out["mm"], expected["mm"]), (out["parts"][0], expected["parts"][0]),
                          (out["parts"][1][0], expected["parts"][1][0])]:
            assert is_evaluated(got)
            np.testing.assert_array_equal(np.array(got), np.array(want))
        assert out["parts"][1][1] == "tag"


@on_every_loop
async def test_run_returns_plain_values():
    async with ea.Runtime(pool_size=4) as rt:
        assert await rt.default_queue().run(lambda: 42) == 42
        assert await rt.default_queue().run(lambda: None) is None


@on_every_loop
async def test_run_uses_the_queue_stream_as_thread_default():
    async with ea.Runtime(pool_size=4) as rt:
        async with rt.queue() as q:
            index = await q.run(lambda: ea._native.lib.emlx_thread_stream_index(0))
            assert index == q.stream_index


@on_every_loop
async def test_lazy_results_stay_on_their_queue_and_chain():
    async with ea.Runtime(pool_size=4) as rt:
        async with rt.queue() as q:
            x = await q.run(lambda: mx.arange(10) * 2, lazy=True)
            assert not is_evaluated(x)
            assert rt.queue_of(x) is q
            y = await q.run(lambda v: v + 1, x, lazy=True)  # extends the same graph on q
            result = await ea.eval(y)
            assert result is y and is_evaluated(y) and is_evaluated(x)
            np.testing.assert_array_equal(np.array(y), np.arange(10) * 2 + 1)
            assert rt.queue_of(y) is None  # evaluated arrays belong to nobody


@on_every_loop
async def test_eval_item_to_numpy():
    async with ea.Runtime(pool_size=4) as rt:
        async with rt.queue() as q:
            x = await q.run(lambda: mx.array([1.5, 2.5]).sum(), lazy=True)
            assert await ea.item(x) == 4.0
            y = await q.run(lambda: mx.arange(6).reshape(2, 3), lazy=True)
            arr = await ea.to_numpy(y)
            np.testing.assert_array_equal(arr, np.arange(6).reshape(2, 3))
            a, b = await ea.eval(await q.run(lambda: mx.ones(2), lazy=True), mx.zeros(2) + 1)
            assert is_evaluated(a) and is_evaluated(b)
            await ea.synchronize()
            await ea.synchronize(queue=q)


@on_every_loop
async def test_cross_queue_lazy_input_is_evaluated_on_its_owner():
    async with ea.Runtime(pool_size=4) as rt:
        q1 = await rt.acquire_queue()
        q2 = await rt.acquire_queue()
        try:
            assert q1 is not q2
            x = await q1.run(lambda: mx.arange(4) + 10, lazy=True)
            y = await q2.run(lambda v: v * 3, x)  # x belongs to q1's thread
            np.testing.assert_array_equal(np.array(y), (np.arange(4) + 10) * 3)
            assert is_evaluated(x)
        finally:
            rt.release_queue(q1)
            rt.release_queue(q2)


@on_every_loop
async def test_foreign_lazy_array_gets_a_clear_error():
    async with ea.Runtime(pool_size=4) as rt:
        import threading

        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("x", mx.ones(3) + 1))
        thread.start()
        thread.join()
        with pytest.raises(ea.ForeignLazyArrayError, match="no queue of this runtime owns"):
            await rt.default_queue().run(lambda v: v, box["x"])
        assert await rt.default_queue().run(lambda: 1) == 1


@on_every_loop
async def test_a_foreign_node_deep_in_a_loop_thread_graph_gets_the_same_error():
    """The top node is the loop thread's own; MLX refuses the foreign one only when it reaches it."""
    async with ea.Runtime() as rt:
        import threading

        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("x", mx.ones(3) + 1))
        thread.start()
        thread.join()
        mixed = mx.ones(3) * box["x"]  # built here, on this thread's default stream
        for submit in (lambda: ea.eval(mixed), lambda: ea.ops.add(mixed, 1),
                       lambda: rt.default_queue().run(lambda v: v, mixed)):
            with pytest.raises(ea.ForeignLazyArrayError, match=r"built on Stream\(cpu, \d+\), in the graph given"):
                await submit()
        assert (await ea.ops.add(mx.ones(3) * 2, 1)).tolist() == [3, 3, 3]


@on_every_loop
async def test_lazy_arrays_on_another_stream_of_the_loop_thread_are_evaluated_there():
    """mx.new_stream's streams belong to the thread that made them, as the default one does."""
    async with ea.Runtime() as rt:
        side = mx.new_stream(mx.cpu)
        with mx.stream(side):
            x = mx.ones(2) * 5
        assert (await ea.ops.multiply(x, 2)).tolist() == [10.0, 10.0]
        y = mx.add(mx.ones(3), 1, stream=side)
        assert (await ea.eval(y)).tolist() == [2.0, 2.0, 2.0]
        z = mx.add(mx.ones(2), 2, stream=side)
        assert await rt.default_queue().run(lambda v: v.tolist(), z) == [3.0, 3.0]


@on_every_loop
async def test_evaluations_the_runtime_makes_refuse_what_cannot_be_allocated():
    """MLX's allocator ends the process on a failed allocation (SIGSEGV, even under a memory
    limit): the loop thread's eval of lazy inputs, q.run's eval of its result and a native
    eval of an owned graph check the graph first."""
    huge = (2**20, 2**20)  # 4 TiB of float32
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        owned = await q.run(lambda: mx.zeros(huge), lazy=True)
        for call in (lambda: ea.ops.add(mx.zeros(huge), 1), lambda: ea.eval(mx.zeros(huge)),
                     lambda: q.run(lambda: mx.zeros(huge)), lambda: ea.eval(owned)):
            with pytest.raises(ea.MLXRuntimeError, match=r"\[eval\] an array of shape \(1048576, 1048576\)"):
                await call()
        assert (await ea.ops.add(mx.ones(2), 1)).tolist() == [2.0, 2.0]
        # Views allocate nothing: a huge broadcast read through a small slice evaluates, as in mlx.
        small = mx.broadcast_to(mx.ones((1,)), huge)[:2, :2].sum()
        assert (await ea.eval(small)).item() == 4.0
        assert (await q.run(lambda: mx.broadcast_to(mx.ones((1,)), huge)[:2, :2].sum())).item() == 4.0


@on_every_loop
async def test_mlx_error_in_run_keeps_type_and_message_and_queue_works():
    async with ea.Runtime(pool_size=4) as rt:
        async with rt.queue() as q:
            with pytest.raises(ValueError, match=r"^\[matmul\] Last dimension"):
                await q.run(lambda: mx.ones((2, 3)) @ mx.ones((2, 3)))
            assert await q.run(lambda: 7) == 7


@on_every_loop
async def test_user_exception_keeps_type_and_traceback():
    async with ea.Runtime(pool_size=4) as rt:
        class Boom(Exception):
            pass

        def fails():
            raise Boom("from the worker")

        with pytest.raises(Boom, match="from the worker") as info:
            await rt.default_queue().run(fails)
        assert any(entry.name == "fails" for entry in info.traceback)
        assert await rt.default_queue().run(lambda: "still working") == "still working"


@on_every_loop
async def test_native_eval_error_is_mlx_message_and_classed():
    async with ea.Runtime(pool_size=4) as rt:
        async with rt.queue() as q:
            singular = await q.run(lambda: mx.linalg.inv(mx.zeros((2, 2)), stream=mx.cpu), lazy=True)
            with pytest.raises(ea.MLXRuntimeError, match=r"^\[Inverse::eval_cpu\]") as info:
                await ea.eval(singular)
            assert isinstance(info.value, RuntimeError) and isinstance(info.value, ea.EMLXError)
            assert await ea.item(await q.run(lambda: mx.array(3) * 2, lazy=True)) == 6


@on_every_loop
async def test_run_rejects_coroutines_and_non_callables():
    async with ea.Runtime(pool_size=4) as rt:
        async def coro():
            return 1

        with pytest.raises(TypeError, match="plain callable"):
            await rt.default_queue().run(coro)
        with pytest.raises(TypeError, match="needs a callable"):
            rt.default_queue().run(42)


@on_every_loop
async def test_lazy_nowait_and_check_finite_take_bools_only():
    """As every flag of the package: 1 or "yes" would be read as true, 0 or None as false."""
    async with ea.Runtime(pool_size=2) as rt:
        q = rt.default_queue()
        a = mx.ones((3,))
        calls = [("add", "lazy", lambda v: ea.ops.add(a, a, lazy=v)),
                 ("add", "nowait", lambda v: ea.ops.add(a, a, nowait=v)),
                 ("queue.run()", "lazy", lambda v: q.run(lambda: a, lazy=v)),
                 ("queue", "nowait", lambda v: q.run(lambda: a, nowait=v)),
                 ("queue", "nowait", lambda v: q.eval(a, nowait=v)),
                 ("queue", "nowait", lambda v: q.synchronize(nowait=v))]
        for where, name, call in calls:
            for bad in (1, 0, "yes", None, np.True_):
                with pytest.raises(ea.InvalidArgumentType,
                                   match=re.escape(f"[{where}] {name} must be True or False, got {bad!r}")):
                    call(bad)
        for bad in (1, 0, "yes", np.True_):  # None: the default (set_check_finite)
            with pytest.raises(ea.InvalidArgumentType,
                               match=re.escape(f"[add] check_finite must be True or False, got {bad!r}")):
                ea.ops.add(a, a, check_finite=bad)
        assert (await ea.ops.add(a, a, check_finite=None)).tolist() == [2.0, 2.0, 2.0]
        assert (await ea.ops.add(a, a, lazy=False, nowait=True)).tolist() == [2.0, 2.0, 2.0]
        assert (await ea.eval(await ea.ops.add(a, a, lazy=True))).tolist() == [2.0, 2.0, 2.0]
        assert (await q.run(lambda: a * 3, nowait=False)).tolist() == [3.0, 3.0, 3.0]
        assert q.stats().submitted == 5  # three adds, the lazy one's eval, the run: no refused call took a place


@on_every_loop
async def test_bind_routes_and_is_inherited_by_child_tasks():
    async with ea.Runtime(pool_size=4) as rt:
        async with rt.queue() as q:
            assert ea.current_queue() is q
            assert ea.bound_queue() is q

            async def child():
                return ea.current_queue()

            async with anyio.create_task_group() as tg:  # a child task inherits the binding
                seen = []
                tg.start_soon(lambda: _append(seen, child()))
            assert seen == [q]
        assert ea.bound_queue() is None
        assert ea.current_queue() is rt.default_queue()


@on_every_loop
async def test_siblings_do_not_share_bindings():
    async with ea.Runtime(pool_size=4) as rt:
        seen = {}

        async def worker(name):
            async with rt.queue() as q:
                await anyio.sleep(0.01)
                seen[name] = (q, ea.current_queue())

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker, "a")
            tg.start_soon(worker, "b")
        assert seen["a"][0] is seen["a"][1] and seen["b"][0] is seen["b"][1]
        assert seen["a"][0] is not seen["b"][0]


@on_every_loop
async def test_routing_order():
    async with ea.Runtime(pool_size=4) as rt:
        q_bound = await rt.acquire_queue()
        q_owner = await rt.acquire_queue()
        q_explicit = await rt.acquire_queue()
        try:
            lazy = await q_owner.run(lambda: mx.ones(2) * 5, lazy=True)
            from emlx_async._routing import route

            with ea.bind(q_bound):
                assert route([lazy], queue=q_explicit, runtime=ea.get_runtime) is q_explicit
                assert route([lazy], runtime=ea.get_runtime) is q_owner
                assert route([mx.ones(2)], runtime=ea.get_runtime) is q_bound
                np.testing.assert_array_equal(np.array(await ea.run(lambda v: v + 1, lazy)), [6, 6])
            assert route([mx.ones(2)], runtime=ea.get_runtime) is rt.default_queue()
        finally:
            for q in (q_bound, q_owner, q_explicit):
                rt.release_queue(q)


@on_every_loop
async def test_pool_is_bounded_and_reuses_queues():
    async with ea.Runtime(pool_size=4) as rt:
        leases = [await rt.acquire_queue() for _ in range(rt.pool_size)]
        assert len({id(q) for q in leases}) == rt.pool_size
        got = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _append(got, rt.acquire_queue()))
            await anyio.sleep(0.01)
            assert not got  # pool exhausted: waits
            rt.release_queue(leases[0])
        assert got == [leases[0]]
        for q in leases:
            rt.release_queue(q)


@on_every_loop
async def test_try_acquire_lends_a_free_queue_or_none_without_waiting():
    async with ea.Runtime(pool_size=2) as rt:
        first = rt.try_acquire_queue()
        second = await rt.acquire_queue()
        assert first is not None and first is not second
        assert rt.try_acquire_queue() is None  # every queue lent: no wait, no new queue
        rt.release_queue(first)
        assert rt.try_acquire_queue() is first  # the idle one again
        for q in (first, second):
            rt.release_queue(q)


@on_every_loop
async def test_gpu_queue_on_cpu_build_is_a_clear_error():
    async with ea.Runtime(pool_size=4) as rt:
        if mx.is_available(mx.gpu):
            pytest.skip("this MLX build has a GPU")
        with pytest.raises(ea.DeviceUnavailable, match="gpu is not available"):
            async with rt.queue("gpu"):
                pass
        with pytest.raises(ValueError, match="unknown device"):
            rt.default_queue("tpu")


async def _append(into: list, awaitable) -> None:
    into.append(await awaitable)


@on_loops("asyncio", "uvloop")
@pytest.mark.gpu
async def test_gpu_queue_matches_plain_mlx(rt):
    if not mx.is_available(mx.gpu):
        pytest.skip("no GPU backend in this MLX build")
    a = mx.random.normal((128, 128), key=mx.random.key(3))
    mx.eval(a)
    async with rt.queue("gpu") as q:
        got = await q.run(lambda x: x @ x.T, a)
    want = reference(lambda: mx.matmul(a, a.T, stream=mx.gpu))
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-4)


@on_every_loop
async def test_implicit_runtime_without_setup():
    x = mx.ones(3) + 2
    assert await ea.item((await ea.run(lambda v: v.sum(), x))) == 9.0
    runtime = ea.get_runtime()
    assert runtime is ea.get_runtime()
    await runtime.close()  # normally done at loop shutdown; see test_process.py


@on_every_loop
async def test_runtime_needs_a_running_loop():
    def make():
        return ea.Runtime()

    with pytest.raises(RuntimeError, match="inside a running event loop"):
        await anyio.to_thread.run_sync(make)


@on_every_loop
async def test_a_submission_whose_inputs_need_nothing_checks_them_in_its_one_native_call(monkeypatch):
    """Evaluated inputs, or lazy ones of the target's own stream: no per-input state call from Python.

    Inputs that do need preparing (a graph built on the loop thread, or
    owned by another queue) are still found: the native submit refuses them
    unqueued, and the general path prepares them.
    """
    async with ea.Runtime() as rt:
        q, other = rt.default_queue(), rt.callback_queue()
        a, b = mx.ones((4, 4)), mx.full((4, 4), 2.0)
        mx.eval(a, b)
        own = await ea.ops.add(a, b, queue=q, lazy=True)  # a graph of q's stream
        real_state, calls = _interop.array_state, []

        def counting_state(array):
            calls.append(array)
            return real_state(array)

        monkeypatch.setattr(_interop, "array_state", counting_state)
        assert np.array(await q.eval(a)).tolist() == np.ones((4, 4)).tolist()
        assert np.array(await ea.ops.add(a, b, queue=q)).tolist() == np.full((4, 4), 3.0).tolist()
        assert np.array(await ea.ops.multiply(own, b, queue=q)).tolist() == np.full((4, 4), 6.0).tolist()
        assert calls == []
        on_loop = a + 1  # lazy, on the loop thread's stream: evaluated there first
        elsewhere = await ea.ops.add(a, 1.0, queue=other, lazy=True)  # owned by another queue
        assert np.array(await ea.ops.add(on_loop, elsewhere, queue=q)).tolist() == np.full((4, 4), 4.0).tolist()
        assert len(calls) == 2 and is_evaluated(on_loop) and is_evaluated(elsewhere)
        assert q.stats().submitted == 5 and q.stats().failed == 0  # each submission counted once


def test_a_queue_s_address_buffer_is_reused_up_to_its_size_and_fresh_past_it():
    from emlx_async import _interop

    buffer = _interop.AddressBuffer()
    small = [mx.ones(1), mx.zeros(2)]
    first = buffer.of(small)
    assert buffer.of(small[::-1]) is first  # one reused cffi array, no allocation per submit
    assert [first[0], first[1]] == [id(small[1]), id(small[0])]
    large = [mx.ones(1) for _ in range(_interop.AddressBuffer.SIZE + 1)]
    fresh = buffer.of(large)
    assert fresh is not first and list(fresh) == [id(a) for a in large]
