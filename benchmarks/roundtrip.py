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

The cases of a loop take turns in `--rounds` rounds (each case's iterations
split evenly, a few warm-up awaits before each share), so that a change in
the machine's load during the run (a shared machine's other work starting
or stopping) reaches every case of that loop alike instead of a few; a
ratio then compares cases measured under the same conditions.
`--rounds 1` measures each case in one block, as before.

    python benchmarks/roundtrip.py [--iterations 2000] [--rounds 10]
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


async def measure(fn, iterations: int, samples: list[float], warm_up: int) -> None:
    for _ in range(warm_up):  # wake threads and warm caches after the previous case
        await fn()
    for _ in range(iterations):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)


async def measure_all(cases: dict, iterations: int, rounds: int) -> dict[str, list[float]]:
    """Every case's samples, the cases taking turns in `rounds` rounds."""
    results: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):
        share = iterations // rounds + (1 if r < iterations % rounds else 0)
        for name, fn in cases.items():
            await measure(fn, share, results[name], warm_up=min(200, iterations) if r == 0 else 20)
    return results


async def suite(iterations: int, rounds: int, baselines: dict) -> dict[str, list[float]]:
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
        results = await measure_all(cases, iterations, rounds)
    return results


async def asyncio_suite(iterations: int, rounds: int) -> dict[str, list[float]]:
    loop = asyncio.get_running_loop()
    return await suite(iterations, rounds, {
        "empty: asyncio.to_thread": lambda: asyncio.to_thread(noop),
        "empty: run_in_executor": lambda: loop.run_in_executor(None, noop),
    })


async def trio_suite(iterations: int, rounds: int) -> dict[str, list[float]]:
    # Under the baseline row's name, so report() finds it.
    return await suite(iterations, rounds, {"empty: asyncio.to_thread": lambda: trio.to_thread.run_sync(noop)})


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
    parser.add_argument("--rounds", type=int, default=10, help="rounds the cases of a loop take turns in")
    args = parser.parse_args()
    rounds = max(1, min(args.rounds, args.iterations))
    print(f"mlx {mx.__version__}, emlx_async {ea.__version__}, {args.iterations} iterations per case "
          f"in {rounds} rounds")
    on_asyncio = asyncio.run(asyncio_suite(args.iterations, rounds))
    report("asyncio", on_asyncio)
    on_uvloop = uvloop.run(asyncio_suite(args.iterations, rounds))
    report("uvloop", on_uvloop)
    on_trio = trio.run(trio_suite, args.iterations, rounds)
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
    print("\none row, p50 in us (asyncio eval/to_thread, uvloop eval/to_thread, trio eval and trio/asyncio, "
          "asyncio add/sync, trio add/sync):")
    pairs = [(on_asyncio[native], on_asyncio[base]), (on_uvloop[native], on_uvloop[base]),
             (on_trio[native], on_asyncio[native]), (on_asyncio[op], on_asyncio[sync]), (on_trio[op], on_trio[sync])]
    cells = [f"{p50(a) * 1e6:5.1f}/{p50(b) * 1e6:5.1f} {p50(a) / p50(b):.2f}x" for a, b in pairs]
    cells[2] = f"{p50(on_trio[native]) * 1e6:5.1f} {p50(on_trio[native]) / p50(on_asyncio[native]):.2f}x"
    print("  " + "   ".join(cells))

if __name__ == "__main__":
    main()
