"""Concurrent decode streams on SmolLM2-135M, live in the terminal.

Runs N prompts at once (default 4), each on its own pooled command queue,
and redraws one line per stream as tokens arrive, with per-stream and
aggregate tokens/s, time to first token, and the event loop's lag measured
by a 1 ms ticker task. Ends with a summary.

    python examples/concurrent_decode.py [-n 4] [--max-tokens 48] [--temperature 0] [--mode parallel|batch]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time

import emlx_async as ea
from emlx_async.llm import Engine, RequestStats
from emlx_async.testing import LoopLag

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What do bees make?",
    "Explain what a CPU cache is in two sentences.",
    "What is the tallest mountain on Earth?",
    "Name three primary colours.",
    "Why is the sky blue? Answer briefly.",
    "Suggest a name for a friendly robot.",
]


class Board:
    """One line per stream, redrawn in place on a terminal (plain lines otherwise)."""

    def __init__(self, n: int, live: bool) -> None:
        self.texts = [""] * n
        self.stats = [RequestStats() for _ in range(n)]
        self.done = [False] * n
        self.live = live
        self._drawn = False

    def line(self, i: int, width: int) -> str:
        st = self.stats[i]
        ttft = f"{st.time_to_first_token:4.1f}s" if st.time_to_first_token is not None else "  -  "
        head = f"[{i}] {st.generated_tokens:3d} tok {st.tokens_per_second:5.1f} tok/s ttft {ttft} {'done' if self.done[i] else '....'} | "
        text = self.texts[i].replace("\n", " ")
        room = max(10, width - len(head))
        return head + (text if len(text) <= room else "…" + text[-(room - 1):])

    def draw(self, lag: LoopLag, started: float) -> None:
        if not self.live:
            return
        width = shutil.get_terminal_size((120, 20)).columns - 1
        elapsed = time.perf_counter() - started
        total = sum(s.generated_tokens for s in self.stats)
        lines = [self.line(i, width)[:width] for i in range(len(self.texts))]
        lines.append(f"aggregate {total / max(elapsed, 1e-9):5.1f} tok/s | loop lag p99 {1000 * lag.p99():5.2f} ms | {elapsed:5.1f}s")
        if self._drawn:
            sys.stdout.write(f"\x1b[{len(lines)}F")
        sys.stdout.write("".join(f"\x1b[2K{line}\n" for line in lines))
        sys.stdout.flush()
        self._drawn = True


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--streams", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--mode", choices=["parallel", "batch"], default="parallel",
                        help="one queue per stream, or continuous batching on one queue")
    args = parser.parse_args()

    async with ea.Runtime(pool_size=max(2, args.streams)) as runtime:
        print("loading SmolLM2-135M-Instruct (Q4_1 GGUF) on a worker queue ...", flush=True)
        engine = await Engine.load(runtime=runtime, max_concurrent=args.streams, mode=args.mode)
        board = Board(args.streams, live=sys.stdout.isatty())
        lag = LoopLag().start()
        started = time.perf_counter()

        async def stream(i: int) -> None:
            prompt = PROMPTS[i % len(PROMPTS)]
            async for delta in engine.generate(messages=[{"role": "user", "content": prompt}],
                                               max_tokens=args.max_tokens, temperature=args.temperature,
                                               seed=i, stats=board.stats[i]):
                board.texts[i] += delta.text
            board.done[i] = True
            if not board.live:
                print(board.line(i, 160), flush=True)

        async def redraw() -> None:
            while True:
                board.draw(lag, started)
                await asyncio.sleep(0.1)

        painter = asyncio.create_task(redraw())
        await asyncio.gather(*(stream(i) for i in range(args.streams)))
        elapsed = time.perf_counter() - started
        painter.cancel()
        await lag.stop()
        board.draw(lag, started)

        total = sum(s.generated_tokens for s in board.stats)
        ttfts = [s.time_to_first_token for s in board.stats if s.time_to_first_token is not None]
        print("\nsummary")
        for i, prompt in enumerate(PROMPTS[: args.streams]):
            print(f"  [{i}] {prompt}\n      -> {board.texts[i].strip()}")
        print(f"  streams {args.streams}, tokens {total}, wall {elapsed:.1f}s, "
              f"aggregate {total / elapsed:.1f} tok/s, mean ttft {sum(ttfts) / max(len(ttfts), 1):.2f}s, "
              f"loop lag p99 {1000 * lag.p99():.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
