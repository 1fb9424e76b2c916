"""Concurrent decode on SmolLM2-135M: emlx_async against the common recipes.

All in one run, for N = 1, 2, 4, 8 concurrent requests with the same raw
prompts and the same token budget (greedy):
  (a) plain mlx-lm-style decode loop, synchronous on the loop thread, one
      request after another (the raw limit of one stream; blocks the loop);
  (b) asyncio.to_thread, one thread per request (each thread gets its own
      MLX stream): the usual workaround;
  (c) mlx-lm's own continuous batching (BatchGenerator) on one thread;
  (d) emlx_async, one pooled queue per stream (mode "parallel"; with the
      default pool, requests beyond the pool wait for a queue);
  (e) emlx_async, continuous batching on one queue (mode "batch");
  then (d) and (e) under asyncio and trio in interleaved rounds (a fresh
  `asyncio.run` and `trio.run` each), as the ratio of the median rates
  (target: trio within 3% of asyncio).
Every scenario stops a request at end-of-sequence, so all produce the same
tokens. Reports aggregate tokens/s, time to first token, p50/p99 inter-token latency
and the p99 lag of a 1 ms ticker on the event loop; throughput as a ratio
to (a) of the same N.

    python benchmarks/decode.py [--tokens 16] [--streams 1,2,4,8] [--loop-rounds 3] [--trio-only]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

import anyio
import mlx.core as mx
import trio

import emlx_async as ea
from emlx_async.llm import Engine
from emlx_async.testing import LoopLag

from _prompts import PROMPTS  # noqa: E402 - benchmarks/ is the script's directory


@dataclass
class Trace:
    start: float
    stamps: list[float] = field(default_factory=list)  # when each token became available


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sync_decode(engine, prompt: list[int], tokens: int, trace: Trace) -> None:
    """A plain mlx-lm decode loop: prefill, then one token per forward pass, until EOS."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(engine.model)
    x = mx.array(prompt)[None]
    for _ in range(tokens):
        y = mx.argmax(engine.model(x, cache=cache)[:, -1, :], axis=-1)
        if y.item() in engine.eos_ids:
            break
        trace.stamps.append(time.perf_counter())
        x = y[None]


async def run_plain(engine, prompts, tokens):
    traces = [Trace(time.perf_counter()) for _ in prompts]  # all requests arrive now
    for p, trace in zip(prompts, traces):
        sync_decode(engine, p, tokens, trace)
        await asyncio.sleep(0)
    return traces


async def run_to_thread(engine, prompts, tokens):
    traces = [Trace(time.perf_counter()) for _ in prompts]
    await asyncio.gather(*(asyncio.to_thread(sync_decode, engine, p, tokens, t)
                           for p, t in zip(prompts, traces)))
    return traces


async def run_mlx_lm_batch(engine, prompts, tokens):
    from mlx_lm.generate import BatchGenerator

    traces = [Trace(time.perf_counter()) for _ in prompts]

    def work():
        gen = BatchGenerator(engine.model, stop_tokens=[[e] for e in engine.eos_ids],
                             completion_batch_size=len(prompts),
                             prefill_batch_size=len(prompts))
        uids = gen.insert(prompts, max_tokens=[tokens] * len(prompts))
        index = {uid: i for i, uid in enumerate(uids)}
        while responses := gen.next_generated():
            now = time.perf_counter()
            for r in responses:
                if r.token not in engine.eos_ids:
                    traces[index[r.uid]].stamps.append(now)

    await asyncio.to_thread(work)
    return traces


def run_engine(mode):
    async def run(engine, prompts, tokens):
        engine.mode = mode
        traces = [Trace(time.perf_counter()) for _ in prompts]

        async def one(p, trace):
            async for delta in engine.generate(p, max_tokens=tokens):
                if delta.token is not None:
                    trace.stamps.append(time.perf_counter())

        async with anyio.create_task_group() as tg:  # asyncio or trio
            for p, t in zip(prompts, traces):
                tg.start_soon(one, p, t)
        return traces
    return run


SCENARIOS = {
    "(a) sync on loop, sequential": run_plain,
    "(b) asyncio.to_thread": run_to_thread,
    "(c) mlx-lm BatchGenerator": run_mlx_lm_batch,
    "(d) emlx_async parallel": run_engine("parallel"),
    "(e) emlx_async batch": run_engine("batch"),
}


def summarize(traces: list[Trace], wall: float) -> tuple[int, float, float, list[float]]:
    total = sum(len(t.stamps) for t in traces)
    ttft = statistics.mean(t.stamps[0] - t.start for t in traces if t.stamps)
    gaps = [b - a for t in traces for a, b in zip(t.stamps, t.stamps[1:])]
    return total, total / wall, ttft, gaps


async def main(args, counts: list[int], rates: dict) -> None:
    # Defaults on both sides, as a user gets them: the runtime's pool is one
    # queue per core (at least 2), asyncio's executor min(32, cores + 4)
    # threads. More streams than cores only thrash a small CPU.
    async with ea.Runtime() as runtime:
        engine = await Engine.load(runtime=runtime, max_concurrent=max(counts))
        prompts = [engine.encode(p) for p in PROMPTS]
        # Warm up every thread each scenario will use: MLX re-traces compiled
        # functions on each new thread, which should not count against one side.
        await run_engine("parallel")(engine, prompts[:runtime.pool_size], 2)
        await run_to_thread(engine, prompts[:6], 2)
        print(f"mlx {mx.__version__}, device {mx.default_device()}, {args.tokens} tokens per request, greedy")
        print(f"{'N':>2} {'scenario':30} {'tokens':>6} {'agg tok/s':>9} {'ratio':>6} {'ttft s':>7} "
              f"{'itl p50 ms':>10} {'itl p99 ms':>10} {'lag p99 ms':>10}")
        for n in counts:
            base = None
            for name, scenario in SCENARIOS.items():
                async with LoopLag() as lag:
                    await asyncio.sleep(0.01)
                    start = time.perf_counter()
                    traces = await scenario(engine, [prompts[i % len(prompts)] for i in range(n)], args.tokens)
                    wall = time.perf_counter() - start
                total, rate, ttft, gaps = summarize(traces, wall)
                base = base or rate
                rates[(n, name)] = rate
                print(f"{n:>2} {name:30} {total:6d} {rate:9.2f} {rate / base:6.2f} {ttft:7.2f} "
                      f"{1000 * pct(gaps, 0.5):10.1f} {1000 * pct(gaps, 0.99):10.1f} "
                      f"{1000 * lag.p99():10.2f}", flush=True)


ENGINE_SCENARIOS = ("(d) emlx_async parallel", "(e) emlx_async batch")


async def engine_rates(args, counts: list[int]) -> dict:
    """Aggregate tok/s of the engine's two modes for each N, on the running loop (asyncio or trio)."""
    async with ea.Runtime() as runtime:
        engine = await Engine.load(runtime=runtime, max_concurrent=max(counts))
        prompts = [engine.encode(p) for p in PROMPTS]
        await run_engine("parallel")(engine, prompts[:runtime.pool_size], 2)  # warm every queue thread
        rates = {}
        for n in counts:
            for name in ENGINE_SCENARIOS:
                await anyio.sleep(0.01)
                start = time.perf_counter()
                traces = await SCENARIOS[name](engine, [prompts[i % len(prompts)] for i in range(n)], args.tokens)
                rates[(n, name)] = summarize(traces, time.perf_counter() - start)[1]
        return rates


def compare_loops(args, counts: list[int]) -> None:
    """The engine under trio against asyncio: rounds of one asyncio.run and one trio.run each.

    Interleaved, and in alternating order, so drift on a shared machine
    (other processes starting or stopping) and whatever the first run of a
    round pays fall on both loops alike; the ratio is of the medians.
    """
    runs: dict[str, list[dict]] = {"asyncio": [], "trio": []}
    for round_ in range(args.loop_rounds):
        order = ["asyncio", "trio"] if round_ % 2 == 0 else ["trio", "asyncio"]  # neither always goes first
        for loop in order:
            runs[loop].append(asyncio.run(engine_rates(args, counts)) if loop == "asyncio"
                              else trio.run(engine_rates, args, counts))
    print(f"\ntrio against asyncio ({args.loop_rounds} interleaved rounds, median tok/s; target: ratio >= 0.97)")
    print(f"{'N':>2} {'scenario':30} {'asyncio':>8} {'trio':>8} {'ratio':>6}  per round")
    for n in counts:
        for name in ENGINE_SCENARIOS:
            on_asyncio = [r[(n, name)] for r in runs["asyncio"]]
            on_trio = [r[(n, name)] for r in runs["trio"]]
            ratio = statistics.median(on_trio) / statistics.median(on_asyncio)
            rounds = " ".join(f"{t / a:.2f}" for a, t in zip(on_asyncio, on_trio))
            print(f"{n:>2} {name:30} {statistics.median(on_asyncio):8.2f} {statistics.median(on_trio):8.2f} "
                  f"{ratio:6.2f}  {rounds}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="concurrent decode benchmark")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--no-trio", action="store_true", help="skip the trio comparison")
    parser.add_argument("--trio-only", action="store_true", help="only the trio comparison")
    parser.add_argument("--loop-rounds", type=int, default=3, help="interleaved asyncio/trio rounds")
    cli = parser.parse_args()
    streams = [int(n) for n in cli.streams.split(",")]
    if not cli.trio_only:
        asyncio.run(main(cli, streams, {}))
    if not cli.no_trio:
        compare_loops(cli, streams)
