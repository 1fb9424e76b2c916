"""Time to first token for a repeated ~500-token prefix, with and without the prompt cache, in both modes.

A long system prompt is shared by two chats with different questions. For
each engine mode, an engine without a cache answers the second chat (its
full prefill), and an engine with a ``PrefixCache`` answers the first chat
(which fills the cache) and then the second one (which reuses the shared
prefix). Greedy answers must be identical with and without the cache.

The lookup section times ``restore`` alone on a cache holding many
entries (tiny keys and values, so only the lookup counts): the time to find
the longest prefix among them.

    python benchmarks/prompt_cache.py [--prefix-tokens 500] [--max-tokens 8]
    python benchmarks/prompt_cache.py --lookup-only [--entries 1000] [--entry-tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import emlx_async as ea
from emlx_async.llm import Engine, PrefixCache

_RULES = [
    "Answer in one short sentence.", "Prefer plain words over jargon.", "Never invent facts.",
    "If you do not know, say so.", "Use metric units.", "Name cities in English.",
    "Keep a friendly tone.", "Do not repeat the question.",
]


def system_prompt(engine: Engine, tokens: int) -> str:
    """A system prompt of about `tokens` tokens, made of numbered rules."""
    lines, i = ["You are a careful geography assistant. Follow these rules:"], 0
    while len(engine.encode(prompt="\n".join(lines))) < tokens:
        lines.append(f"Rule {i + 1}: {_RULES[i % len(_RULES)]}")
        i += 1
    return "\n".join(lines)


async def first_token(engine: Engine, messages: list[dict], max_tokens: int) -> tuple[float, str]:
    started = time.perf_counter()
    ttft, text = None, ""
    async for delta in engine.generate(messages=messages, max_tokens=max_tokens):
        if ttft is None and delta.token is not None:
            ttft = time.perf_counter() - started
        text += delta.text
    return ttft or float("nan"), text


def lookup(entries: int, entry_tokens: int, lookups: int = 200) -> None:
    """Per-restore time with `entries` kept sequences of `entry_tokens` tokens sharing a 32-token prefix."""
    import random

    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    def filled(tokens: list[int]) -> list:
        layer = KVCache()
        kv = mx.zeros((1, 1, len(tokens), 1))
        layer.update_and_fetch(kv, kv)
        return [layer]

    rng = random.Random(0)
    shared = list(range(32))
    sequences = [shared + [rng.randrange(50_000) for _ in range(entry_tokens - 32)] for _ in range(entries)]
    cache = PrefixCache(entries * entry_tokens)
    for tokens in sequences:
        cache.save(tokens, filled(tokens))
    prompts = [rng.choice(sequences)[:rng.randrange(33, entry_tokens)] + [7] for _ in range(lookups)]
    started = time.perf_counter()
    for prompt in prompts:
        assert cache.restore(prompt, [KVCache()]) == len(prompt) - 1
    per = (time.perf_counter() - started) / lookups
    print(f"lookup: {entries} entries of {entry_tokens} tokens: {per * 1e6:.0f} us per restore", flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--entry-tokens", type=int, default=200)
    parser.add_argument("--lookup-only", action="store_true", help="only the lookup section (no model)")
    args = parser.parse_args()
    for entries in sorted({args.entries // 10, args.entries}):
        lookup(max(entries, 1), args.entry_tokens)
    if args.lookup_only:
        return
    async with ea.Runtime() as rt:
        rows = []
        for mode in ("parallel", "batch"):
            plain = await Engine.load(runtime=rt, mode=mode)
            cache = PrefixCache(4096)
            cached = await Engine.load(runtime=rt, mode=mode, prompt_cache=cache)
            system = {"role": "system", "content": system_prompt(plain, args.prefix_tokens)}
            first = [system, {"role": "user", "content": "What is the capital of France?"}]
            second = [system, {"role": "user", "content": "What is the capital of Germany?"}]
            prompt_tokens = len(plain.encode(messages=second))
            await first_token(plain, [{"role": "user", "content": "Hi"}], 2)  # warm up both engines' code paths
            await first_token(cached, [{"role": "user", "content": "Hi"}], 2)
            cold, text_plain = await first_token(plain, second, args.max_tokens)
            fill, _ = await first_token(cached, first, args.max_tokens)
            hits_before = cache.reused_tokens
            warm, text_cached = await first_token(cached, second, args.max_tokens)
            reused = cache.reused_tokens - hits_before
            if text_cached != text_plain:
                raise SystemExit(f"{mode}: the cached answer {text_cached!r} differs from {text_plain!r}")
            rows.append((mode, prompt_tokens, reused, cold, fill, warm))
            print(f"{mode}: prompt {prompt_tokens} tokens, {reused} reused; TTFT without cache {cold:.2f} s, "
                  f"filling the cache {fill:.2f} s, with the cached prefix {warm:.2f} s "
                  f"({cold / warm:.1f}x faster)", flush=True)
            for engine in (plain, cached):
                await engine.wait_idle()
        print()
        print(f"{'mode':<10}{'prompt':>8}{'reused':>8}{'no cache s':>12}{'fill s':>9}{'cached s':>10}{'speed-up':>10}")
        for mode, prompt_tokens, reused, cold, fill, warm in rows:
            print(f"{mode:<10}{prompt_tokens:>8}{reused:>8}{cold:>12.2f}{fill:>9.2f}{warm:>10.2f}{cold / warm:>9.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
