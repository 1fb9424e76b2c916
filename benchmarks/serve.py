"""Closed-loop load on the HTTP service (emlx_async.serve) in each engine
mode, and on mlx-lm's own server on the very same weights.

The script converts the GGUF into an mlx-lm folder in a temporary directory
(`emlx_async.llm.save.convert`, what `emlx-async convert` runs), then for
each server: starts it on a free loopback port (`python -m emlx_async.serve
--mode M`, or `python -m mlx_lm server --model DIR`), waits for /health, and
for N = 1, 4, 8, 16 clients: each client sends streamed greedy chat
completions back to back (`--requests` each, `--tokens` max_tokens each, the
same prompts for every server) and times every chunk as it arrives. Prints
aggregate tokens/s, time to first token p50/p99, inter-token latency p50/p99
and errors; then stops the server by its pid (SIGTERM, SIGKILL after 30 s).
Last, the ratios ours/mlx-lm at each N, and whether the greedy texts agree.

    python benchmarks/serve.py [--servers parallel,batch,mlx-lm] [--clients 1,4,8,16]
                               [--requests 2] [--tokens 16] [--max-concurrent 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from _prompts import PROMPTS  # noqa: E402 - benchmarks/ is the script's directory

MLX_LM = "mlx-lm"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(server: str, port: int, max_concurrent: int, folder: str | None, log) -> subprocess.Popen:
    if server == MLX_LM:
        # Its defaults: continuous batching of up to 32 decodes, 8 prompts at once, a prompt cache.
        command = [sys.executable, "-m", "mlx_lm", "server", "--model", folder, "--host", "127.0.0.1",
                   "--port", str(port), "--log-level", "WARNING"]
    else:
        command = [sys.executable, "-m", "emlx_async.serve", "--mode", server, "--host", "127.0.0.1",
                   "--port", str(port), "--max-concurrent", str(max_concurrent), "--log-level", "warning"]
    # Into a log file (mlx-lm's server prints a line per request); shown if the server fails.
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()  # SIGTERM: ours drains gracefully; mlx-lm's ends
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def wait_ready(url: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
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


async def one_request(client: httpx.AsyncClient, prompt: str, tokens: int, ttfts: list, itls: list) -> tuple[int, str]:
    """Streams one chat completion; returns (its completion tokens from the usage chunk, its text)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    last = None
    generated = 0
    text = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
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
            content = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if content:
                now = time.perf_counter()
                if last is None:
                    ttfts.append(now - start)
                else:
                    itls.append(now - last)
                last = now
                text.append(content)
    return generated, "".join(text)


async def load(url: str, clients: int, requests: int, tokens: int) -> dict:
    ttfts: list[float] = []
    itls: list[float] = []
    errors: list[str] = []
    texts: dict[str, str] = {}
    total = 0

    async def client_loop(index: int) -> None:
        nonlocal total
        async with httpx.AsyncClient(base_url=url, timeout=900) as client:
            for r in range(requests):
                prompt = PROMPTS[(index + r) % len(PROMPTS)]
                try:
                    generated, text = await one_request(client, prompt, tokens, ttfts, itls)
                    total += generated  # not `total += await ...`: that reads total before the await
                    texts.setdefault(prompt, text)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    wall = time.perf_counter() - start
    return {"clients": clients, "tokens": total, "wall": wall, "tok_s": total / wall,
            "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
            "itl_p50": pct(itls, 0.5), "itl_p99": pct(itls, 0.99), "errors": errors, "texts": texts}


def print_row(server: str, row: dict) -> None:
    print(f"{server:<9} {row['clients']:>7} {row['tokens']:>6} {row['tok_s']:>7.2f} "
          f"{row['ttft_p50']:>8.2f}s {row['ttft_p99']:>8.2f}s {row['itl_p50'] * 1e3:>6.0f}ms "
          f"{row['itl_p99'] * 1e3:>6.0f}ms {len(row['errors']):>6}", flush=True)
    for error in row["errors"][:3]:
        print(f"    error: {error}")


async def bench_server(server: str, counts: list[int], requests: int, tokens: int, max_concurrent: int,
                       folder: str | None) -> list[dict]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = start_server(server, port, max_concurrent, folder, log)
        try:
            await wait_ready(url, process)
            await load(url, 1, 1, 2)  # warm-up: the first request pays one-time costs
            rows = []
            for n in counts:
                rows.append(await load(url, n, requests, tokens))
                print_row(server, rows[-1])
                if rows[-1]["errors"]:
                    _print_log_tail(log)
            return rows
        except Exception:
            _print_log_tail(log)
            raise
        finally:
            stop_server(process)


def _print_log_tail(log, lines: int = 20) -> None:
    log.seek(0)
    for line in log.read().decode(errors="replace").splitlines()[-lines:]:
        print(f"    server: {line}")
    log.seek(0, os.SEEK_END)


def main() -> None:
    parser = argparse.ArgumentParser(description="closed-loop load on the HTTP service and on mlx-lm's server")
    parser.add_argument("--servers", default=f"parallel,batch,{MLX_LM}",
                        help=f"our engine modes (parallel, batch) and/or {MLX_LM}")
    parser.add_argument("--clients", default="1,4,8,16")
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per request")
    parser.add_argument("--max-concurrent", type=int, default=8, help="our server's --max-concurrent")
    args = parser.parse_args()
    counts = [int(n) for n in args.clients.split(",")]
    servers = args.servers.split(",")
    print(f"streamed greedy chat completions, {args.requests} per client, max_tokens {args.tokens}; "
          f"ours with --max-concurrent {args.max_concurrent}, {MLX_LM} {_mlx_lm_version()} with its defaults")
    print(f"{'server':<9} {'clients':>7} {'tokens':>6} {'tok/s':>7} {'ttft p50':>9} {'ttft p99':>9} "
          f"{'itl p50':>8} {'itl p99':>8} {'errors':>6}")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="emlx-serve-bench-") as tmp:
        folder = None
        if MLX_LM in servers:
            from emlx_async.llm.save import convert

            folder = os.path.join(tmp, "smollm2-mlx")
            convert(None, folder)  # SmolLM2's GGUF: the same weights for every server
        for server in servers:
            results[server] = asyncio.run(bench_server(server, counts, args.requests, args.tokens,
                                                       args.max_concurrent, folder))
    if MLX_LM in results:
        print_comparison(results, counts)


def print_comparison(results: dict[str, list[dict]], counts: list[int]) -> None:
    theirs = {row["clients"]: row for row in results[MLX_LM]}
    print(f"\nours / {MLX_LM} (tok/s: higher is better; ttft p99: lower is better)")
    print(f"{'server':<9} {'clients':>7} {'tok/s':>7} {'ttft p99':>9}")
    for server, rows in results.items():
        if server == MLX_LM:
            continue
        for row in rows:
            other = theirs[row["clients"]]
            print(f"{server:<9} {row['clients']:>7} {row['tok_s'] / other['tok_s']:>6.2f}x "
                  f"{row['ttft_p99'] / other['ttft_p99']:>8.2f}x")
    # The same weights and greedy decoding: the texts should agree (batched
    # float arithmetic may still move a late token).
    reference = results[MLX_LM][0]["texts"]
    for server, rows in results.items():
        if server != MLX_LM:
            texts = rows[0]["texts"]
            same = sum(texts.get(p) == t for p, t in reference.items())
            print(f"greedy texts at N={counts[0]}, {server} against {MLX_LM}: {same} of {len(reference)} equal")


def _mlx_lm_version() -> str:
    from importlib.metadata import version

    return version("mlx-lm")


if __name__ == "__main__":
    main()
