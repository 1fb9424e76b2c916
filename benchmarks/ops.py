"""Native ops: awaited one at a time, pipelined, and chained lazily, in one run.

For a handful of ops on small (4x4) and large (512x512) inputs:
  * sync: the op + mx.eval called on the loop thread (the baseline; it blocks
    the loop for the whole computation);
  * awaited: `await ea.ops.<op>(...)`, one at a time;
  * pipelined: 256 submitted at once, then gathered (per-op time).
And a 50-op chain: every op awaited vs `lazy=True` links awaited once.
Prints per-op times and ratios to the sync baseline of the same run.

    python benchmarks/ops.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import mlx.core as mx
import uvloop

import emlx_async as ea

CASES = {
    "add": (lambda a, b: mx.add(a, b), lambda a, b, **k: ea.ops.add(a, b, **k)),
    "matmul": (lambda a, b: mx.matmul(a, b), lambda a, b, **k: ea.ops.matmul(a, b, **k)),
    "sum(axis=1)": (lambda a, b: mx.sum(a, axis=1), lambda a, b, **k: ea.ops.sum(a, axis=1, **k)),
    "softmax": (lambda a, b: mx.softmax(a, axis=-1), lambda a, b, **k: ea.ops.softmax(a, axis=-1, **k)),
}


async def per_op(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def suite(repeat: int) -> None:
    async with ea.Runtime(max_pending=4096) as rt:
        q = rt.default_queue()
        print(f"{'op':12} {'size':>7} {'sync us':>9} {'awaited us':>11} {'ratio':>6} {'pipelined us/op':>16} {'ratio':>6}")
        for n in (4, 512):
            a = mx.random.normal((n, n), key=mx.random.key(0))
            b = mx.random.normal((n, n), key=mx.random.key(1))
            mx.eval(a, b)
            reps = repeat if n == 4 else max(10, repeat // 10)
            for name, (sync_op, async_op) in CASES.items():
                async def sync():
                    mx.eval(sync_op(a, b))

                sync_t = await per_op(sync, reps)
                await per_op(lambda: async_op(a, b, queue=q), 10)
                awaited = await per_op(lambda: async_op(a, b, queue=q), reps)
                count = 256 if n == 4 else 32
                start = time.perf_counter()
                await asyncio.gather(*(async_op(a, b, queue=q) for _ in range(count)))
                pipelined = (time.perf_counter() - start) / count
                print(f"{name:12} {n:>4}x{n:<3} {sync_t * 1e6:9.1f} {awaited * 1e6:11.1f} {awaited / sync_t:6.2f} "
                      f"{pipelined * 1e6:16.1f} {pipelined / sync_t:6.2f}")

        x = mx.random.normal((64, 64), key=mx.random.key(2))
        mx.eval(x)

        async def each_awaited():
            y = x
            for _ in range(50):
                y = await ea.ops.multiply(y, 1.001, queue=q)
            return y

        async def fused():
            y = x
            for _ in range(49):
                y = await ea.ops.multiply(y, 1.001, queue=q, lazy=True)
            return await ea.ops.multiply(y, 1.001, queue=q)

        def sync_chain():
            y = x
            for _ in range(50):
                y = y * 1.001
            mx.eval(y)

        async def sync_chain_async():
            sync_chain()

        base = await per_op(sync_chain_async, 20)
        t_each = await per_op(each_awaited, 20)
        t_fused = await per_op(fused, 20)
        print(f"\n50-op chain on 64x64: sync one graph {base * 1e6:.0f} us; each op awaited {t_each * 1e6:.0f} us "
              f"({t_each / base:.2f}x); lazy links, awaited once {t_fused * 1e6:.0f} us ({t_fused / base:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description="native op benchmark")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"mlx {mx.__version__}, emlx_async {ea.__version__}, uvloop")
    uvloop.run(suite(args.repeat))


if __name__ == "__main__":
    main()
