"""Time to first token of n choices from one prefill (``Engine.generate_choices``) against one request
and against n separate requests (n prefills), in both modes, on SmolLM2.

Each run asks a question of its own after a shared ~`--prompt-tokens` system prompt, so no
run reuses another's keys and values (the engines have no prompt cache). "first" is the
time to the first token of any choice; "all" the time until every choice has its first token.

    python benchmarks/choices.py [--n 4] [--prompt-tokens 128] [--max-tokens 4]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import emlx_async as ea
from emlx_async.llm import Engine


def messages(engine: Engine, tokens: int, question: str) -> list[dict]:
    lines = ["You are a careful geography assistant. Follow these rules:"]
    while len(engine.encode(prompt="\n".join(lines))) < tokens:
        lines.append(f"Rule {len(lines)}: answer in one short sentence and never invent facts.")
    return [{"role": "system", "content": "\n".join(lines)}, {"role": "user", "content": question}]


async def choices(engine: Engine, chat: list[dict], n: int, max_tokens: int) -> tuple[float, float]:
    started, first = time.perf_counter(), {}
    async for i, delta in engine.generate_choices(messages=chat, n=n, max_tokens=max_tokens, temperature=0.8,
                                                  seed=1):
        if delta.token is not None:
            first.setdefault(i, time.perf_counter() - started)
    return min(first.values()), max(first.values())


async def separate(engine: Engine, chat: list[dict], n: int, max_tokens: int) -> tuple[float, float]:
    started, first = time.perf_counter(), []

    async def one(seed: int) -> None:
        async for delta in engine.generate(messages=chat, max_tokens=max_tokens, temperature=0.8, seed=seed):
            if delta.token is not None:
                first.append(time.perf_counter() - started)
                return

    await asyncio.gather(*(one(seed) for seed in range(n)))
    return min(first), max(first)


async def main(args) -> None:
    print(f"{'mode':9} {'request':22} {'first s':>8} {'all s':>8}")
    for mode in ("parallel", "batch"):
        async with ea.Runtime(pool_size=max(args.n + 1, 2)) as rt:
            engine = await Engine.load(runtime=rt, mode=mode, max_concurrent=args.n)
            runs = [("n=1", lambda chat: choices(engine, chat, 1, args.max_tokens)),
                    (f"n={args.n}, one prefill", lambda chat: choices(engine, chat, args.n, args.max_tokens)),
                    (f"{args.n} separate requests", lambda chat: separate(engine, chat, args.n, args.max_tokens))]
            for k, (name, run) in enumerate(runs):
                chat = messages(engine, args.prompt_tokens, f"Question {k}: what is the capital of country {k}?")
                first, last = await run(chat)
                print(f"{mode:9} {name:22} {first:8.2f} {last:8.2f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
