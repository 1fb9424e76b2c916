"""Closed-loop load on the HTTP service (emlx_async.serve), in each engine mode.

For each mode it starts `python -m emlx_async.serve` on a free loopback
port, then for N = 1, 4, 8 clients: each client sends streamed greedy
completions back to back (`--requests` each, `--tokens` tokens each) and
times every token as it arrives. Prints aggregate tokens/s, time to first
token p50/p99, inter-token latency p50/p99 and errors; then stops the
server with SIGTERM.

    python benchmarks/serve.py [--modes parallel,batch] [--clients 1,4,8] [--requests 2] [--tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx

from _prompts import PROMPTS  # noqa: E402 - benchmarks/ is the script's directory


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(mode: str, port: int, max_concurrent: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "emlx_async.serve", "--mode", mode, "--host", "127.0.0.1",
                             "--port", str(port), "--max-concurrent", str(max_concurrent),
                             "--log-level", "warning"], stdin=subprocess.DEVNULL)


async def wait_ready(url: str, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}")
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the server did not become ready")


async def one_request(client: httpx.AsyncClient, prompt: str, tokens: int, ttfts: list, itls: list) -> int:
    """Streams one completion; returns its completion tokens (from the usage chunk)."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    last = None
    generated = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                generated = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                now = time.perf_counter()
                if last is None:
                    ttfts.append(now - start)
                else:
                    itls.append(now - last)
                last = now
    return generated


async def load(url: str, clients: int, requests: int, tokens: int) -> dict:
    ttfts: list[float] = []
    itls: list[float] = []
    errors: list[str] = []
    total = 0

    async def client_loop(index: int) -> None:
        nonlocal total
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            for r in range(requests):
                try:
                    generated = await one_request(client, PROMPTS[(index + r) % len(PROMPTS)], tokens, ttfts, itls)
                    total += generated  # not `total += await ...`: that reads total before the await
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(str(exc))

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    wall = time.perf_counter() - start
    return {"clients": clients, "tokens": total, "wall": wall, "tok_s": total / wall,
            "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
            "itl_p50": pct(itls, 0.5), "itl_p99": pct(itls, 0.99), "errors": errors}


async def bench_mode(mode: str, counts: list[int], requests: int, tokens: int) -> list[dict]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(mode, port, max(counts))
    try:
        await wait_ready(url, process)
        await load(url, 1, 1, 2)  # warm-up
        return [await load(url, n, requests, tokens) for n in counts]
    finally:
        process.terminate()  # SIGTERM: a graceful stop
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="closed-loop load on the HTTP service")
    parser.add_argument("--modes", default="parallel,batch")
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per request")
    args = parser.parse_args()
    counts = [int(n) for n in args.clients.split(",")]
    print(f"streamed greedy completions, {args.requests} per client, max_tokens {args.tokens}")
    print(f"{'mode':<9} {'clients':>7} {'tokens':>6} {'tok/s':>7} {'ttft p50':>9} {'ttft p99':>9} "
          f"{'itl p50':>8} {'itl p99':>8} {'errors':>6}")
    for mode in args.modes.split(","):
        for row in asyncio.run(bench_mode(mode, counts, args.requests, args.tokens)):
            print(f"{mode:<9} {row['clients']:>7} {row['tokens']:>6} {row['tok_s']:>7.1f} "
                  f"{row['ttft_p50']:>8.2f}s {row['ttft_p99']:>8.2f}s {row['itl_p50'] * 1e3:>6.0f}ms "
                  f"{row['itl_p99'] * 1e3:>6.0f}ms {len(row['errors']):>6}", flush=True)
            for error in row["errors"][:3]:
                print(f"    error: {error}")


if __name__ == "__main__":
    main()
