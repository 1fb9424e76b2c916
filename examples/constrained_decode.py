"""A decode loop whose logits pass through an async host callback every step.

The callback runs on the event loop inside the model's graph: here it is a
constrained-vocabulary filter that only lets through tokens spelled with
letters, spaces and basic punctuation (so no digits), the way a grammar or
a policy service would steer generation. It is `async`, so it could consult
a database or another service without blocking the loop.

    python examples/constrained_decode.py [--max-tokens 40]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time

import mlx.core as mx
import numpy as np

import emlx_async as ea
from emlx_async.llm import Engine

ALLOWED = re.compile(r"^[A-Za-z ,.'!?\n]*$")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--prompt", default="Count from one to five, then name three fruits.")
    args = parser.parse_args()

    async with ea.Runtime() as rt:
        engine = await Engine.load(runtime=rt)
        vocab = [engine.tokenizer.decode([i]) for i in range(engine.model.args.vocab_size)]
        allowed = np.array([bool(ALLOWED.match(t)) or i in engine.eos_ids for i, t in enumerate(vocab)])
        mask = mx.array(np.where(allowed, 0.0, -np.inf).astype(np.float32))
        calls = 0

        async def keep_allowed(logits: mx.array) -> mx.array:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0)  # e.g. ask a policy service
            return logits.astype(mx.float32) + mask

        from mlx_lm.models.cache import make_prompt_cache

        def step(state, tokens):
            logits = engine.model(mx.array(tokens)[None], cache=state["cache"])[:, -1, :]
            filtered, = ea.host_call(keep_allowed, logits, outputs=[(logits.shape, mx.float32)])
            return mx.argmax(filtered, axis=-1).item()

        prompt = engine.encode(messages=[{"role": "user", "content": args.prompt}])
        async with rt.queue() as q:
            state = {"cache": await q.run(make_prompt_cache, engine.model, lazy=True)}
            token = await q.run(step, state, prompt)
            out: list[int] = []
            start = time.perf_counter()
            while token not in engine.eos_ids and len(out) < args.max_tokens:
                out.append(token)
                print(engine.tokenizer.decode([token]), end="", flush=True)
                token = await q.run(step, state, [token])
        elapsed = time.perf_counter() - start
        text = engine.tokenizer.decode(out)
        print(f"\n\n{len(out)} tokens, {calls} host calls, {len(out) / max(elapsed, 1e-9):.1f} tok/s; "
              f"digits in the answer: {sum(c.isdigit() for c in text)}")


if __name__ == "__main__":
    asyncio.run(main())
