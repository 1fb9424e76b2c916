"""The cost of a host call: the same graph with and without one, in one run.

For a small graph (64x64 matmul) and a larger one (512x512 matmul + softmax),
times `q.run(graph)` with the graph as is and with an identity host call
(sync and async callback) inserted in the middle, under asyncio and uvloop.
Prints p50/p99 and the p50 ratio to the plain graph.

    python benchmarks/host_call.py [--iterations 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import mlx.core as mx
import uvloop

import emlx_async as ea


def identity(x):
    return x


async def async_identity(x):
    return x


def make_graph(n: int, callback):
    def graph(a):
        h = a @ a
        if callback is not None:
            h, = ea.host_call(callback, h, outputs=[(h.shape, h.dtype)])
        return mx.softmax(h @ a, axis=-1).sum()
    return graph


async def suite(iterations: int) -> list[tuple[str, list[float]]]:
    rows = []
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        for n in (64, 512):
            a = mx.random.normal((n, n), key=mx.random.key(0)) / n
            mx.eval(a)
            for label, callback in (("plain", None), ("+ host_call (sync)", identity),
                                    ("+ host_call (async)", async_identity)):
                graph = make_graph(n, callback)
                for _ in range(20):
                    await q.run(graph, a)
                samples = []
                for _ in range(iterations):
                    start = time.perf_counter()
                    await q.run(graph, a)
                    samples.append(time.perf_counter() - start)
                rows.append((f"{n}x{n} {label}", samples))
    return rows


def report(name: str, rows) -> None:
    print(f"\n[{name}]")
    print(f"{'graph':32} {'p50 us':>9} {'p99 us':>9} {'ratio':>7}")
    base = None
    for label, samples in rows:
        p50 = statistics.median(samples)
        if "plain" in label:
            base = p50
        p99 = sorted(samples)[int(0.99 * (len(samples) - 1))]
        print(f"{label:32} {p50 * 1e6:9.1f} {p99 * 1e6:9.1f} {p50 / base:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description="host call overhead")
    parser.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args()
    print(f"mlx {mx.__version__}, emlx_async {ea.__version__}, {args.iterations} iterations")
    report("asyncio", asyncio.run(suite(args.iterations)))
    report("uvloop", uvloop.run(suite(args.iterations)))


if __name__ == "__main__":
    main()
