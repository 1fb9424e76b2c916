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
  (d') and (e') the same as (d) and (e) with the Python decode step
      (``step="python"``; (e') is mlx-lm's BatchGenerator): (d) and (e)
      replay the traced step natively where the model allows it;
  then (d) and (e) under asyncio and trio in interleaved rounds (a fresh
  `asyncio.run` and `trio.run` each), as the ratio of the median rates
  (target: trio within 3% of asyncio).
Then the busy-loop section: one stream (greedy, each mode) while the
event loop does ordinary Python work (JSON encode/decode, as a server does)
25%, 50% and 100% of the time (100%: yielding only with sleep(0)), against
the same work in another process (CPU contention only), Python step versus
replayed step; decode rate after the first token, and the GIL time per
step (the step's Python on the worker; the loop's submit for a replay).
Every scenario stops a request at end-of-sequence, so all produce the same
tokens. Reports aggregate tokens/s, time to first token, p50/p99 inter-token latency
and the p99 lag of a 1 ms ticker on the event loop; throughput as a ratio
to (a) of the same N.

Then the fast-step section: the scenarios (a), (c), (d), (e) and their
Python-step twins on a tiny random llama whose step takes about 1 ms on this
CPU, as a real model's does on a GPU, constrained requests (a regex
grammar; the replayed step's masked variant) and requests with penalties, a logit bias
and min-p (the replayed step's penalized variant) in either mode, at 1 and 8
streams (the best of three rounds), with the targets: batch mode replayed at 8
streams at least 1.1x mlx-lm's BatchGenerator, one replayed stream at least
1.0x the raw loop.

    python benchmarks/decode.py [--tokens 16] [--streams 1,2,4,8] [--loop-rounds 3] [--trio-only] [--no-trio] [--no-busy]
                                [--fast-only] [--no-fast] [--fast-streams 1,8] [--fast-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import anyio
import mlx.core as mx
import trio

import emlx_async as ea
from emlx_async.llm import Engine, Grammar
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


# The constrained rows' grammar: text that never has to end, so every stream runs its
# tokens (a grammar allows EOS once accepting; greedy on this model never takes it).
CONSTRAINED = "[a-z ,.]+"


# The penalized rows' options: every penalty, a bias and min-p (greedy, so min-p drops nothing).
PENALTIES = dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1, logit_bias={13: -5.0},
                 min_p=0.05)


def run_engine(mode, python_step: bool = False, constrained: bool = False, penalized: bool = False):
    async def run(engine, prompts, tokens):
        engine = engine.python_twin if python_step else engine
        engine.mode = mode
        traces = [Trace(time.perf_counter()) for _ in prompts]
        grammar = Grammar.regex(CONSTRAINED) if constrained else None
        options = PENALTIES if penalized else {}

        async def one(p, trace):
            async for delta in engine.generate(p, max_tokens=tokens, grammar=grammar, **options):
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
    "(d') parallel, Python step": run_engine("parallel", python_step=True),
    "(e) emlx_async batch": run_engine("batch"),
    "(e') batch, Python step": run_engine("batch", python_step=True),
    # Constrained requests take the replayed step's masked variant: compare with (d) and (e).
    "(f) parallel, constrained": run_engine("parallel", constrained=True),
    "(g) batch, constrained": run_engine("batch", constrained=True),
    # Penalties, logit bias and min-p: the replayed step's penalized variant; compare with (d) and (e).
    "(h) parallel, penalties": run_engine("parallel", penalized=True),
    "(i) batch, penalties": run_engine("batch", penalized=True),
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
        start = time.perf_counter()
        engine = await Engine.load(runtime=runtime, max_concurrent=max(counts))
        load_s = time.perf_counter() - start
        engine.python_twin = await twin_of(engine)
        prompts = [engine.encode(p) for p in PROMPTS]
        # Warm up every thread each scenario will use: MLX re-traces compiled
        # functions on each new thread, which should not count against one side.
        await run_engine("parallel")(engine, prompts[:runtime.pool_size], 2)
        await run_engine("parallel", python_step=True)(engine, prompts[:runtime.pool_size], 2)
        for n in counts:  # and the replayed batch's shapes (traced on first use)
            await run_engine("batch")(engine, [prompts[i % len(prompts)] for i in range(n)], 2)
        await run_to_thread(engine, prompts[:6], 2)
        print(f"mlx {mx.__version__}, device {mx.default_device()}, {args.tokens} tokens per request, greedy")
        print(f"engine step: {engine.step_kind} ({engine.step_note}); load with the traces {load_s:.1f} s")
        print(f"{'N':>2} {'scenario':30} {'tokens':>6} {'agg tok/s':>9} {'ratio':>6} {'ttft s':>7} "
              f"{'itl p50 ms':>10} {'itl p99 ms':>10} {'lag p99 ms':>10}")
        for n in counts:
            base = None
            for name, scenario in SCENARIOS.items():
                if name in PENALIZED:  # SmolLM2's 150 ms CPU step hides their cost: the fast-step section has them
                    continue
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


async def twin_of(engine: Engine, mode: str = "parallel", step: str = "python") -> Engine:
    """The same model and tokenizer in `mode` with the `step` decode step."""
    twin = Engine(engine.model, engine.tokenizer, eos_ids=engine.eos_ids, chat_template=engine.chat_template,
                  bos_id=engine.bos_id, runtime=engine.runtime, max_concurrent=engine.max_concurrent, mode=mode)
    await twin.prepare_step(step)
    return twin


# ---- the busy-loop section ----------------------------------------------------------

PAYLOAD = {"items": [{"id": i, "name": f"item-{i}", "tags": ["a", "b", "c"], "score": i * 0.5} for i in range(200)]}
SLICE_S = 0.005
# The same JSON work, all the time, in another process.
OTHER_PROCESS = f"""
import json, time
payload = {PAYLOAD!r}
while True:
    json.loads(json.dumps(payload))
"""


async def busy_loop(share: float, stop: asyncio.Event) -> None:
    """JSON work on the loop for `share` of the time, in slices of 5 ms."""
    while not stop.is_set():
        end = time.perf_counter() + SLICE_S
        while time.perf_counter() < end:
            json.loads(json.dumps(PAYLOAD))
        await asyncio.sleep(0 if share >= 1 else SLICE_S * (1 - share) / share)


async def decode_rate(engine: Engine, prompt: list[int], tokens: int, busy: str | float) -> float:
    """Tokens/s of one stream after its first token, with the loop busy as asked."""
    stop, task, other = asyncio.Event(), None, None
    if busy == "other process":
        other = subprocess.Popen([sys.executable, "-c", OTHER_PROCESS])
        await asyncio.sleep(0.2)  # let it start
    elif busy:
        task = asyncio.ensure_future(busy_loop(busy, stop))
    stamps = []
    try:
        async for delta in engine.generate(prompt, max_tokens=tokens):
            if delta.token is not None:
                stamps.append(time.perf_counter())
    finally:
        stop.set()
        if task is not None:
            await task
        if other is not None:
            other.terminate()  # the process this function started
            other.wait()
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def python_step_gil_ms(engine: Engine, prompt: list[int], steps: int = 8) -> float:
    """The Python step's graph building per step (it holds the GIL), on this thread."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(engine.model)
    mx.eval(engine.model(mx.array([prompt]), cache=cache))
    token, held = mx.array([[1]]), 0.0
    for _ in range(steps):
        start = time.perf_counter()
        logits = engine.model(token, cache=cache)[:, -1, :]
        next_token = mx.argmax(logits, axis=-1)
        held += time.perf_counter() - start
        token = next_token.reshape(1, 1)
        mx.eval(token)  # evaluation releases the GIL
    return 1000 * held / steps


async def replay_submit_ms(engine: Engine, prompt: list[int], tokens: int) -> float:
    """The loop's time per replayed step in the submit call (one native job)."""
    functions = engine.decoding.replay.chains  # a parallel-mode stream's steps (made on first use)
    async for _ in engine.generate(prompt, max_tokens=2):  # makes the chain of this prompt's shape
        pass
    held: list[float] = []

    def timed(function):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                held.append(time.perf_counter() - start)
        return call

    saved = dict(functions)
    functions.update({shape: timed(f) for shape, f in saved.items()})
    try:
        async for _ in engine.generate(prompt, max_tokens=tokens):
            pass
    finally:
        functions.update(saved)
    return 1000 * statistics.median(held)


async def busy_main(args) -> None:
    async with ea.Runtime() as runtime:
        engine = await Engine.load(runtime=runtime, max_concurrent=1)
        twin = await twin_of(engine)
        prompt = engine.encode(PROMPTS[0])
        engines = {"python step": twin, "replayed step": engine}
        if args.busy_batch:
            engines.update({"batch, python": await twin_of(engine, "batch"),
                            "batch, replayed": await twin_of(engine, "batch", "auto")})
        for e in engines.values():
            await decode_rate(e, prompt, 4, 0)  # warm up
        print(f"\nbusy loop: one stream, {args.busy_tokens} tokens, decode tok/s after the first token "
              f"(engine step: {engine.step_kind})")
        print(f"{'loop busy':>26}" + "".join(f" {k + ' tok/s':>20} {'vs other':>8}" for k in engines))
        rates: dict = {}
        for busy in (0, "other process", 0.25, 0.5, 1.0):
            for kind, e in engines.items():
                rates[(busy, kind)] = await decode_rate(e, prompt, args.busy_tokens, busy)
            label = "idle loop" if busy == 0 else busy if isinstance(busy, str) else f"{busy:.0%} in-process"
            print(f"{label:>26}" + "".join(
                f" {rates[(busy, k)]:20.2f} {rates[(busy, k)] / rates[('other process', k)]:7.2f}x"
                if busy != 0 else f" {rates[(busy, k)]:20.2f} {'':>8}" for k in engines), flush=True)
        gil_python = python_step_gil_ms(engine, prompt)
        gil_replay = await replay_submit_ms(engine, prompt, args.busy_tokens)
        print(f"GIL per step: Python step {gil_python:.2f} ms of graph building on the worker; "
              f"replayed step {gil_replay:.3f} ms on the loop (the submit), 0 on the worker")


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


# ---- the fast-step section ------------------------------------------------------------

FAST_SCENARIOS = ("(a) sync on loop, sequential", "(c) mlx-lm BatchGenerator", "(d) emlx_async parallel",
                  "(d') parallel, Python step", "(e) emlx_async batch", "(e') batch, Python step",
                  "(f) parallel, constrained", "(g) batch, constrained", "(h) parallel, penalties",
                  "(i) batch, penalties")
CONSTRAINED_PAIRS = (("(f) parallel, constrained", "(d) emlx_async parallel"),
                     ("(g) batch, constrained", "(e) emlx_async batch"))
PENALIZED_PAIRS = (("(h) parallel, penalties", "(d) emlx_async parallel"),
                   ("(i) batch, penalties", "(e) emlx_async batch"))
PENALIZED = {penalized for penalized, _ in PENALIZED_PAIRS}


async def fast_main(args) -> None:
    """The same scenarios on a tiny random llama (hidden 128, 2 layers), whose step
    is about 1 ms on a CPU, as a real model's is on a GPU: what the runtime costs
    per step shows, where SmolLM2's 150 ms CPU step hides it."""
    import tempfile

    from _tiny_model import tiny_model_folder

    counts = [int(n) for n in args.fast_streams.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        tiny_model_folder(folder)
        async with ea.Runtime() as runtime:
            engine = await Engine.load(folder, runtime=runtime, max_concurrent=max(counts))
            engine.python_twin = await twin_of(engine)
            prompts = [engine.encode(p) for p in PROMPTS]
            for n in counts:  # warm every shape and thread each scenario uses
                batch = [prompts[i % len(prompts)] for i in range(n)]
                for name in FAST_SCENARIOS:
                    await SCENARIOS[name](engine, batch, 4)
            step_ms = _sync_step_ms(engine, prompts[0])
            print(f"\nfast step: tiny random llama (hidden 128, 2 layers, vocabulary 49152), "
                  f"{step_ms:.2f} ms per synchronous step; {args.fast_tokens} tokens per stream, greedy; "
                  f"engine step: {engine.step_kind}")
            print(f"{'N':>2} {'scenario':30} {'tokens':>6} {'agg tok/s':>9} {'vs (a)':>6} {'vs (c)':>6}")
            rates: dict = {}
            for n in counts:
                batch = [prompts[i % len(prompts)] for i in range(n)]
                for _ in range(args.fast_rounds):  # the best of a few rounds: the machine is shared
                    for name in FAST_SCENARIOS:
                        start = time.perf_counter()
                        traces = await SCENARIOS[name](engine, batch, args.fast_tokens)
                        total, rate, _, _ = summarize(traces, time.perf_counter() - start)
                        rates[(n, name)] = max(rate, rates.get((n, name), 0.0))
                for name in FAST_SCENARIOS:
                    rate = rates[(n, name)]
                    print(f"{n:>2} {name:30} {total:6d} {rate:9.1f} "
                          f"{rate / rates[(n, FAST_SCENARIOS[0])]:6.2f} {rate / rates[(n, FAST_SCENARIOS[1])]:6.2f}",
                          flush=True)
            most = max(counts)
            print(f"targets: batch replayed at {most} streams / BatchGenerator = "
                  f"{rates[(most, '(e) emlx_async batch')] / rates[(most, FAST_SCENARIOS[1])]:.2f} (>= 1.1); "
                  f"one stream parallel replayed / raw loop = "
                  f"{rates[(min(counts), '(d) emlx_async parallel')] / rates[(min(counts), FAST_SCENARIOS[0])]:.2f} "
                  f"(>= 1.0)")
            for n in counts:
                ratios = [rates[(n, constrained)] / rates[(n, free)] for constrained, free in CONSTRAINED_PAIRS]
                print(f"constrained / unconstrained replayed step at {n} streams: parallel {ratios[0]:.2f}, "
                      f"batch {ratios[1]:.2f} (target >= 0.9)")
            for n in counts:
                ratios = [rates[(n, penalized)] / rates[(n, free)] for penalized, free in PENALIZED_PAIRS]
                print(f"penalized / plain replayed step at {n} streams: parallel {ratios[0]:.2f}, "
                      f"batch {ratios[1]:.2f}")


def _sync_step_ms(engine: Engine, prompt: list[int], steps: int = 32) -> float:
    trace = Trace(time.perf_counter())
    sync_decode(engine, prompt, steps, trace)
    gaps = [b - a for a, b in zip(trace.stamps, trace.stamps[1:])]
    return 1000 * statistics.median(gaps) if gaps else float("nan")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="concurrent decode benchmark")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--no-trio", action="store_true", help="skip the trio comparison")
    parser.add_argument("--trio-only", action="store_true", help="only the trio comparison")
    parser.add_argument("--loop-rounds", type=int, default=3, help="interleaved asyncio/trio rounds")
    parser.add_argument("--no-busy", action="store_true", help="skip the busy-loop section")
    parser.add_argument("--busy-only", action="store_true", help="only the busy-loop section")
    parser.add_argument("--busy-tokens", type=int, default=24)
    parser.add_argument("--busy-batch", action="store_true", help="also batch mode in the busy-loop section")
    parser.add_argument("--no-fast", action="store_true", help="skip the fast-step section")
    parser.add_argument("--fast-only", action="store_true", help="only the fast-step section")
    parser.add_argument("--fast-streams", default="1,8")
    parser.add_argument("--fast-tokens", type=int, default=64)
    parser.add_argument("--fast-rounds", type=int, default=3, help="rounds of the fast-step section (best kept)")
    cli = parser.parse_args()
    streams = [int(n) for n in cli.streams.split(",")]
    only = cli.trio_only or cli.busy_only or cli.fast_only
    if not only:
        asyncio.run(main(cli, streams, {}))
    if not (cli.no_trio or only and not cli.trio_only):
        compare_loops(cli, streams)
    if not (cli.no_busy or only and not cli.busy_only):
        asyncio.run(busy_main(cli))
    if not (cli.no_fast or only and not cli.fast_only):
        asyncio.run(fast_main(cli))
