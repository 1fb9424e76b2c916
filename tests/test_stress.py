"""Many tasks, many queues, many jobs: results bit-identical to a sequential run."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import numpy as np

import emlx_async as ea


async def test_16_tasks_x_100_matmuls_across_4_queues_bit_identical(loop_errors):
    inputs = [mx.random.normal((256, 256), key=mx.random.key(i)) for i in range(16)]
    mx.eval(inputs)
    weight = mx.random.normal((256, 256), key=mx.random.key(99)) / 16.0
    mx.eval(weight)

    def step(x):
        return mx.tanh(x @ weight)

    expected = []
    for x in inputs:  # sequential reference with plain MLX on this thread
        for _ in range(100):
            x = step(x)
            mx.eval(x)
        expected.append(np.array(x))

    async with ea.Runtime(pool_size=4) as runtime:
        async def task(i):
            async with runtime.queue() as q:
                x = inputs[i]
                for _ in range(100):
                    x = await q.run(step, x)
                return np.array(x)

        results = await asyncio.gather(*(task(i) for i in range(16)))
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


async def test_10000_jobs_in_flight_on_one_queue(loop_errors):
    async with ea.Runtime(max_pending=20_000) as runtime:
        q = runtime.default_queue()
        futures = [q.run(int, i) for i in range(10_000)]
        assert q.pending > 0
        assert await asyncio.gather(*futures) == list(range(10_000))
        evals = [q.eval(mx.array(i)) for i in range(10_000)]
        assert len(await asyncio.gather(*evals)) == 10_000
        assert q.pending == 0
