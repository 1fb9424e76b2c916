"""The sharded engine against one process, on this machine, in one run.

SmolLM2-135M greedy decode, one request of --tokens tokens:
  (a) one process, the batch engine (the baseline);
  (b) the same model sharded over --ranks ranks (ShardedEngine, MLX's ring
      backend on loopback, started here), measured on rank 0;
and on rank 0, the collectives one sharded step needs, timed on their own:
the plan broadcast (one all_sum of 4 KiB) plus two all_sums of one token's
activations per layer (mlx-lm's sharded attention and MLP each end in one),
as a share of the sharded step. Last, the CPU every rank burns while the
server is idle (the idle plans; a rank parked inside a ring collective polls
its socket instead). It also says whether (b)'s tokens are (a)'s and which
step each engine took (``step_kind``, and the sharded one's ``step_note``).
Then one stream's sharded decode step, every rank at once: mlx-lm's model
call with its cache (the Python step) against the engine's fixed-buffer
step traced by the group (``group.trace``, its all_sums native). Last, the
sharded engine with each step (its replayed rounds, and ``step="python"``:
mlx-lm's batched step, one plan a step), one stream and --streams at once,
in tokens per second on rank 0.

``--tiny`` runs a tiny random llama instead (benchmarks/_tiny_model.py: 4
query and 2 key-value heads, so 2 ranks divide it, where SmolLM2's 9 and 3
need 3): the quick form, a check of tokens and step more than of speed.

    python benchmarks/distributed.py [--tokens 24] [--ranks 3] [--streams 4] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

CHAT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def step_times(deltas_at: list[float]) -> list[float]:
    return [b - a for a, b in zip(deltas_at, deltas_at[1:])]


async def decode(engine, tokens: int) -> tuple[float, list[float], list[int]]:
    start = time.perf_counter()
    stamps, ids = [], []
    async for delta in engine.generate(messages=CHAT, max_tokens=tokens):
        if delta.token is not None:
            stamps.append(time.perf_counter())
            ids.append(delta.token)
    return stamps[0] - start, step_times(stamps), ids


async def rates(engine, tokens: int, streams: int) -> tuple[float, float]:
    """Tokens per second: one stream, then `streams` at once (each `tokens` long, ignoring end-of-sequence)."""
    import anyio

    async def one() -> int:
        return sum([1 async for d in engine.generate(messages=CHAT, max_tokens=tokens, ignore_eos=True)
                    if d.token is not None])

    out = []
    for n in (1, streams):
        counts: list[int] = []

        async def counted() -> None:
            counts.append(await one())

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(counted)
        out.append(sum(counts) / (time.perf_counter() - start))
    return out[0], out[1]


async def one_process(tokens: int, path: str | None) -> dict:
    from emlx_async.llm import Engine

    engine = await Engine.load(path, mode="batch")
    await decode(engine, 4)  # warm-up
    ttft, steps, ids = await decode(engine, tokens)
    args = engine.model.args
    await engine.runtime.close()
    return {"ttft": ttft, "step": statistics.median(steps), "steps": len(steps), "tokens": ids,
            "step_kind": engine.step_kind, "layers": args.num_hidden_layers, "hidden": args.hidden_size}


async def rank_main(tokens: int, path: str | None, layers: int, hidden: int, streams: int) -> None:
    import mlx.core as mx

    from emlx_async import distributed as dist
    from emlx_async.llm.sharded import ShardedEngine, _broadcast_bytes

    group = dist.init(strict=True, backend="ring", timeout=120)
    # The collectives of one decode step, on every rank before the engine
    # starts (its plans would not match): the plan broadcast, then two
    # all_sums of one token's activations per layer (SmolLM2: 30 layers, 576 wide).
    plan = b'{"op": "step", "join": [], "leave": []}' if group.rank() == 0 else None

    def collectives_of_a_step() -> None:
        _broadcast_bytes(group, plan)
        for _ in range(2 * layers):
            mx.eval(mx.distributed.all_sum(mx.zeros((1, 1, hidden)), group=group.mlx_group))

    collective = []
    for _ in range(7):
        start = time.perf_counter()
        await group.run(collectives_of_a_step)
        collective.append(time.perf_counter() - start)
    engine = await ShardedEngine.load(path, group=group)
    # Kept: close (and the stop plan on the followers) drops the engine's model and traces.
    model, step_kind, step_note = engine.model, engine.step_kind, engine.step_note
    if group.rank() != 0:
        await engine.follow()
        await dist.all_sum(mx.ones(1))  # the naive idle follower: parked inside a collective
        await one_stream_steps(group, model)
        for step in ("replay", "python"):
            await (await ShardedEngine.load(path, group=group, step=step)).follow()
        return
    assert len(engine.model.layers) == layers and engine.model.args.hidden_size == hidden
    await decode(engine, 4)  # warm-up
    ttft, steps, ids = await decode(engine, tokens)
    await engine.wait_idle()
    print("IDLE-START", flush=True)
    await asyncio.sleep(3)
    print("IDLE-END", flush=True)
    await engine.close()
    print("SPIN-START", flush=True)  # the followers now wait inside an all_sum
    await asyncio.sleep(3)
    print("SPIN-END", flush=True)
    await dist.all_sum(mx.ones(1))
    python_step, replayed_step = await one_stream_steps(group, model)
    engine_rates = {}
    for step in ("replay", "python"):
        each = await ShardedEngine.load(path, group=group, step=step)
        await rates(each, tokens, streams)  # warm-up: the replayed step traces each new shape on first use
        engine_rates[step] = await rates(each, tokens, streams)
        await each.close()
    print("RESULT " + json.dumps({"rates": engine_rates, "ttft": ttft, "step": statistics.median(steps), "steps": len(steps),
                                  "collective": statistics.median(collective), "layers": layers, "tokens": ids,
                                  "step_kind": step_kind, "step_note": step_note,
                                  "python_step": python_step, "replayed_step": replayed_step}), flush=True)


async def one_stream_steps(group, model, prompt_tokens: int = 16, steps: int = 24) -> tuple[float, float]:
    """One stream's greedy decode step on the sharded model, run by every rank at once: mlx-lm's
    model call and cache on the group's queue (Python), and the engine's fixed-buffer step traced
    by the group (``group.trace``: its all_sums native); the median seconds per step of each."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from emlx_async.llm.replay_step import CacheSpec, make_step
    from emlx_async.llm.traced import sampling_inputs

    prompt = list(range(1, prompt_tokens + 1))

    def python_steps() -> list[float]:
        cache = make_prompt_cache(model)
        token = mx.argmax(model(mx.array([prompt]), cache=cache)[:, -1, :], axis=-1)
        mx.eval(token)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            token = mx.argmax(model(token.reshape(1, 1), cache=cache)[:, -1, :], axis=-1)
            mx.eval(token)
            times.append(time.perf_counter() - start)
        return times

    python = statistics.median(await group.run(python_steps))
    spec = CacheSpec.of(model)
    state = spec.zeros(1, prompt_tokens + steps + 1)
    greedy, key = sampling_inputs(0.0, 1.0, 0, 1), mx.random.key(0)
    token = mx.array([[prompt[0]]], dtype=mx.int32)
    example = [*state, key, token, mx.array(0, dtype=mx.int32), *greedy]
    mx.eval(example)
    step = await group.trace(make_step(model, spec, greedy=True), *example)
    times = []
    for position in range(prompt_tokens + steps):
        start = time.perf_counter()
        next_token, key, *state = await step(*state, key, token, mx.array(position, dtype=mx.int32), *greedy)
        times.append(time.perf_counter() - start)
        token = mx.array([[prompt[position + 1] if position + 1 < prompt_tokens else next_token.item()]],
                         dtype=mx.int32)
    return python, statistics.median(times[prompt_tokens:])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_between(ring, start_mark: str, end_mark: str) -> list[float]:
    """CPU seconds per second of each rank between two lines rank 0 prints."""
    deadline = time.monotonic() + 900
    while start_mark not in ring.output(0):
        assert time.monotonic() < deadline and ring.ranks[0].poll() is None, ring.errors(0)[-3000:]
        time.sleep(0.02)
    before, start = [cpu_seconds(p.pid) for p in ring.ranks], time.monotonic()
    while end_mark not in ring.output(0):
        assert ring.ranks[0].poll() is None, ring.errors(0)[-3000:]
        time.sleep(0.02)
    wall = time.monotonic() - start
    return [(cpu_seconds(p.pid) - b) / wall for p, b in zip(ring.ranks, before)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny random llama (2 or 4 ranks divide it) instead of SmolLM2-135M")
    parser.add_argument("--rank", nargs=3, metavar=("PATH", "LAYERS", "HIDDEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        path, layers, hidden = args.rank
        asyncio.run(rank_main(args.tokens, path or None, int(layers), int(hidden), args.streams))
        return

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="emlx-distributed-bench-") as tmp:
        path = None
        if args.tiny:
            from _tiny_model import tiny_model_folder

            path = str(tiny_model_folder(os.path.join(tmp, "tiny")))
        run(args, path)


def run(args, path: str | None) -> None:
    from emlx_async.testing import LocalRing

    import mlx.core as mx

    base = asyncio.run(one_process(args.tokens, path))
    with LocalRing(args.ranks, [sys.executable, os.path.abspath(__file__), "--tokens", str(args.tokens),
                                "--streams", str(args.streams), "--rank", path or "", str(base["layers"]),
                                str(base["hidden"])]) as ring:
        idle = cpu_between(ring, "IDLE-START", "IDLE-END")
        spin = cpu_between(ring, "SPIN-START", "SPIN-END")
        codes = ring.wait(timeout=600)
        assert codes == [0] * args.ranks, [ring.errors(r)[-3000:] for r in range(args.ranks)]
        sharded = json.loads(ring.output(0).split("RESULT ", 1)[1])

    load = os.getloadavg()[0]
    name = "a tiny random llama (hidden 128, 2 layers)" if path else "SmolLM2-135M"
    print(f"mlx {mx.__version__}, {name}, {args.tokens} greedy tokens, {os.cpu_count()} cores, "
          f"load average {load:.1f} at the end (other work shared the cores)")
    rows = [("(a) one process, batch engine", base["step"], 1.0, ""),
            (f"(b) sharded over {args.ranks} ranks (ring, loopback)", sharded["step"],
             sharded["step"] / base["step"], ""),
            (f"    its collectives alone ({2 * sharded['layers']} + 1 all_sum)", sharded["collective"],
             sharded["collective"] / sharded["step"], "  (share of (b))")]
    print(f"{'case':52} {'per step ms':>12} {'ratio':>7}")
    for label, seconds, ratio, note in rows:
        print(f"{label:52} {seconds * 1e3:12.1f} {ratio:7.2f}{note}")
    print(f"time to first token: one process {base['ttft'] * 1e3:.0f} ms, sharded {sharded['ttft'] * 1e3:.0f} ms")
    print(f"one stream's sharded step on rank 0: mlx-lm's model call (Python) {sharded['python_step'] * 1e3:.2f} ms, "
          f"the engine's step traced by the group (group.trace) {sharded['replayed_step'] * 1e3:.2f} ms "
          f"({sharded['python_step'] / sharded['replayed_step']:.2f}x)")
    print("CPU per rank while idle, s per s: with idle plans " + ", ".join(f"{c:.2f}" for c in idle)
          + "; followers parked in a collective " + ", ".join(f"{c:.2f}" for c in spin))
    replay, python = sharded["rates"]["replay"], sharded["rates"]["python"]
    print(f"the sharded engine, tok/s on rank 0 ({args.tokens} tokens a stream): replayed rounds "
          f"{replay[0]:.1f} (1 stream), {replay[1]:.1f} ({args.streams} streams); Python step {python[0]:.1f}, "
          f"{python[1]:.1f}; replayed / Python {replay[0] / python[0]:.2f}x and {replay[1] / python[1]:.2f}x")
    same = "equal" if sharded["tokens"] == base["tokens"] else f"DIFFERENT ({sharded['tokens']} vs {base['tokens']})"
    print(f"tokens: (b) and (a) {same}; step: (a) {base['step_kind']}, (b) {sharded['step_kind']} "
          f"({sharded['step_note']})")


if __name__ == "__main__":
    main()
