"""Many tasks, many queues, many jobs: results bit-identical to a sequential run."""

from __future__ import annotations

import functools

import anyio
import mlx.core as mx
import numpy as np

import emlx_async as ea
from support.helpers import on_every_loop, wait_all


@functools.cache
def matmul_chains():
    """Inputs, weight and the sequential reference with plain MLX on this thread (once per run)."""
    inputs = [mx.random.normal((256, 256), key=mx.random.key(i)) for i in range(16)]
    mx.eval(inputs)
    weight = mx.random.normal((256, 256), key=mx.random.key(99)) / 16.0
    mx.eval(weight)
    expected = []
    for x in inputs:
        for _ in range(100):
            x = mx.tanh(x @ weight)
            mx.eval(x)
        expected.append(np.array(x))
    return inputs, weight, expected


@on_every_loop
async def test_16_tasks_x_100_matmuls_across_4_queues_bit_identical():
    inputs, weight, expected = matmul_chains()

    def step(x):
        return mx.tanh(x @ weight)

    async with ea.Runtime(pool_size=4) as runtime:
        async def task(i):
            async with runtime.queue() as q:
                x = inputs[i]
                for _ in range(100):
                    x = await q.run(step, x)
                return np.array(x)

        results = [None] * 16

        async def into_results(i):
            results[i] = await task(i)

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(into_results, i)
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


@on_every_loop
async def test_10000_jobs_in_flight_on_one_queue():
    async with ea.Runtime(max_pending=20_000) as runtime:
        q = runtime.default_queue()
        futures = [q.run(int, i) for i in range(10_000)]
        assert q.pending > 0
        assert await wait_all(*futures) == list(range(10_000))
        evals = [q.eval(mx.array(i)) for i in range(10_000)]
        assert len(await wait_all(*evals)) == 10_000
        assert q.pending == 0
