"""Round-trip latency of one job, against the executor baselines, in one run.

For each loop (asyncio, uvloop, trio) it measures p50/p99 of:
  * an empty job through a queue: native (`q.eval` of an evaluated array) and
    Python (`q.run(noop)`), against `asyncio.to_thread(noop)` and
    `loop.run_in_executor(None, noop)` (under trio: `trio.to_thread.run_sync`);
  * a small MLX op + eval, awaited as a native op (`ea.ops.add`, evaluated
    on the worker) and as a Python job (`q.run`), against the same op run
    synchronously on the loop thread.
Prints a table of ratios to the baseline of the same run (machines are
noisy; absolute times mean little), then the targets: the native empty job
at most 0.4x `to_thread` (asyncio, uvloop), trio at most 1.3x asyncio, the
native 4x4 add at most 2x sync (asyncio) and 3x (trio).

    python benchmarks/roundtrip.py [--iterations 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import mlx.core as mx
import trio
import uvloop

import emlx_async as ea


def noop() -> None:
    return None


def small_op(a: mx.array, b: mx.array) -> mx.array:
    out = a + b
    mx.eval(out)
    return out


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(fn, iterations: int) -> list[float]:
    for _ in range(min(200, iterations)):  # warm up threads and caches
        await fn()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return samples


async def suite(iterations: int, baselines: dict) -> dict[str, list[float]]:
    """Every case on the running loop; `baselines` are the thread-pool rows of this async library."""
    a, b = mx.ones((4, 4)), mx.ones((4, 4))
    mx.eval(a, b)
    results = {}
    async with ea.Runtime() as rt:
        q = rt.default_queue()

        async def sync_op():
            small_op(a, b)

        cases = {
            **baselines,
            "empty: q.eval (native job)": lambda: q.eval(a),
            "empty: q.run (Python job)": lambda: q.run(noop),
            "4x4 add+eval: sync on loop": sync_op,
            "4x4 add+eval: ea.ops.add": lambda: ea.ops.add(a, b, queue=q),
            "4x4 add+eval: q.run": lambda: q.run(small_op, a, b),
        }
        for name, fn in cases.items():
            results[name] = await measure(fn, iterations)
    return results


async def asyncio_suite(iterations: int) -> dict[str, list[float]]:
    loop = asyncio.get_running_loop()
    return await suite(iterations, {
        "empty: asyncio.to_thread": lambda: asyncio.to_thread(noop),
        "empty: run_in_executor": lambda: loop.run_in_executor(None, noop),
    })


async def trio_suite(iterations: int) -> dict[str, list[float]]:
    # Under the baseline row's name, so report() finds it.
    return await suite(iterations, {"empty: asyncio.to_thread": lambda: trio.to_thread.run_sync(noop)})


def report(loop_name: str, results: dict[str, list[float]]) -> None:
    base_empty = statistics.median(results["empty: asyncio.to_thread"])
    base_op = statistics.median(results["4x4 add+eval: sync on loop"])
    print(f"\n[{loop_name}]")
    print(f"{'case':34} {'p50 us':>9} {'p99 us':>9} {'p50 ratio':>10}  baseline")
    for name, samples in results.items():
        base, base_name = (base_empty, "to_thread") if name.startswith("empty") else (base_op, "sync on loop")
        p50 = statistics.median(samples)
        print(f"{name:34} {p50 * 1e6:9.1f} {percentile(samples, 0.99) * 1e6:9.1f} {p50 / base:10.2f}  {base_name}")


def main() -> None:
    parser = argparse.ArgumentParser(description="emlx_async round-trip benchmark")
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    print(f"mlx {mx.__version__}, emlx_async {ea.__version__}, {args.iterations} iterations per case")
    on_asyncio = asyncio.run(asyncio_suite(args.iterations))
    report("asyncio", on_asyncio)
    on_uvloop = uvloop.run(asyncio_suite(args.iterations))
    report("uvloop", on_uvloop)
    on_trio = trio.run(trio_suite, args.iterations)
    report("trio (baseline row: trio.to_thread.run_sync)", on_trio)
    p50 = statistics.median
    native, op, sync, base = ("empty: q.eval (native job)", "4x4 add+eval: ea.ops.add", "4x4 add+eval: sync on loop",
                              "empty: asyncio.to_thread")
    print("\ntargets (p50 ratios of this run):")
    for loop_name, results in (("asyncio", on_asyncio), ("uvloop", on_uvloop)):
        print(f"  {loop_name}: native empty job / to_thread {p50(results[native]) / p50(results[base]):.2f}x (<= 0.4x)")
    print(f"  trio / asyncio, native empty job: {p50(on_trio[native]) / p50(on_asyncio[native]):.2f}x (<= 1.3x)")
    print(f"  asyncio: 4x4 add awaited / sync {p50(on_asyncio[op]) / p50(on_asyncio[sync]):.2f}x (<= 2x)")
    print(f"  trio: 4x4 add awaited / sync {p50(on_trio[op]) / p50(on_trio[sync]):.2f}x (<= 3x)")


if __name__ == "__main__":
    main()
