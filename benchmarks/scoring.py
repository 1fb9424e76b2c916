"""Scoring a completion's list of prompts (lm-eval's loglikelihood with ``batch_size`` above 1:
prompt ids, ``echo``, ``logprobs``): the service's prompts scored one after another against
as many at once as the request was admitted as (``Service._echoes``), on SmolLM2, alternated
in one run. Every prompt is new to the engine (no prompt cache between runs).

    python benchmarks/scoring.py [--prompts 8] [--at-once 2,8] [--prompt-tokens 96] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import emlx_async as ea
from emlx_async.llm import Engine
from emlx_async.serve.protocol import GenerationRequest
from emlx_async.serve.service import ServeConfig, Service


def prompts(engine: Engine, count: int, tokens: int, tag: str) -> list[list[int]]:
    """`count` prompts of `tokens` ids each, none sharing a prefix with another (or another run's)."""
    base = engine.encode(" ".join(["The river runs past the old mill and the quiet town."] * (tokens // 10 + 1)))
    return [engine.encode(f"{tag} {i}:")[:4] + base[:tokens - 4] for i in range(count)]


async def main(args) -> None:
    at_once = [int(k) for k in args.at_once.split(",")]
    async with ea.Runtime(pool_size=max(at_once) + 1) as rt:
        engine = await Engine.load(runtime=rt, max_concurrent=max(at_once))
        service = Service(ServeConfig(max_concurrent=max(at_once)))
        print(f"{args.prompts} prompts of {args.prompt_tokens} tokens, scored with logprobs 1")
        print(f"{'round':>5} " + " ".join(f"{'at once ' + str(k):>12}" for k in [1, *at_once]) + "   (seconds)")
        for round in range(args.rounds):
            times = []
            for k in [1, *at_once]:
                ids = prompts(engine, args.prompts, args.prompt_tokens, f"Round {round} limit {k}")
                asked = [GenerationRequest(chat=False, model=None, prompt=p, echo=True, logprobs=True, top_logprobs=1)
                         for p in ids]
                started = time.perf_counter()
                await service._echoes(engine, asked, ids, at_once=k)
                times.append(time.perf_counter() - started)
            print(f"{round:>5} " + " ".join(f"{t:>12.2f}" for t in times) + "   " +
                  " ".join(f"{times[0] / t:.2f}x" for t in times[1:]), flush=True)
        await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--at-once", default="2,8", help="limits to compare with one at a time")
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
