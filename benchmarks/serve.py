"""Closed-loop load on the HTTP service (emlx_async.serve) in each engine
mode, and on two other MLX servers on the very same weights: mlx-lm's own
server and vllm-mlx.

The script converts the GGUF into an mlx-lm folder in a temporary directory
(`emlx_async.llm.save.convert`, what `emlx-async convert` runs), then for
each server: starts it on a free loopback port (`python -m emlx_async.serve
--mode M`, or for batchN `--mode batch --batches N`, `python -m mlx_lm
server --model DIR`, or `vllm-mlx serve DIR --continuous-batching`), waits
for /health, and for N = 1, 4, 8, 16
clients: each client sends streamed greedy chat completions back to back
(`--requests` each, `--tokens` max_tokens each, the same prompts for every
server) and times every chunk as it arrives. Prints aggregate tokens/s,
time to first token p50/p99, inter-token latency p50/p99 and errors; then
stops the server by its pid (SIGTERM, SIGKILL after 30 s). Last, the ratios
ours/peer at each N for each peer server run, the targets (each of our
servers at 8 clients: at least 1.3x each peer's tokens/s with a lower p99 time to first
token; at 1 client: no slower), and whether the greedy texts agree.

--constrained adds constrained rows: at each N, right after the free row,
the same load with every request constrained (`schema`: a response_format
json_schema, strict; `tool`: one tool and tool_choice "required", the call
streamed as delta.tool_calls), then their tokens/s over the same server's
free row (target: at least 0.9x), each kind's warm-up having sent every
prompt once (so the prompt cache is as warm for one row as for the other).
A server that ignores the field or
refuses it is not a failed run: the row's "field" column says what it did
with it (kept: the answer is JSON that starts an object, or a call of the
tool, its head counted as its first token; cut: max_tokens ended the
answer before the call's name was whole; ignored: free text;
or the HTTP status it answered with). mlx-lm's server ignores
response_format (its issue #1007); vllm-mlx's structured output needs
Metal, and a json_schema request is reported to get a 500 on Linux.

vllm-mlx is no dependency of this project: with torch and the rest of its
dependencies it takes several GB, so it is left out of the default
--servers. Naming it installs it once into a virtual environment of its own
(--vllm-venv, by default .bench/vllm-mlx in the repository, which git
ignores) with the same MLX build as ours; a failed install (no network)
skips it with a message. It runs with its continuous-batching engine and
its other defaults (its structured output needs Metal: --constrained rows
show its answer).

    python benchmarks/serve.py [--servers auto,parallel[,batch,batch2],mlx-lm[,vllm-mlx]] [--clients 1,4,8,16]
                               [--requests 2] [--tokens 16] [--max-concurrent 8] [--vllm-venv DIR]
                               [--constrained [schema,tool]]
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
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import httpx

from _prompts import PROMPTS  # noqa: E402 - benchmarks/ is the script's directory

OURS = ("auto", "parallel", "batch")  # "auto" is the service's default mode
# "batchN" (batch2, batch4): batch mode running N batches at once (`--mode batch --batches N`).
BATCHES_PREFIX = "batch"
MLX_LM = "mlx-lm"
VLLM_MLX = "vllm-mlx"
PEERS = (MLX_LM, VLLM_MLX)
# A release pinned, so that runs compare; its own venv reinstalls when this changes.
VLLM_MLX_REQUIREMENT = "vllm-mlx==0.6.0"
DEFAULT_VLLM_VENV = Path(__file__).resolve().parent.parent / ".bench" / VLLM_MLX
# vllm-mlx's requests must name the model (ours and mlx-lm's take their one model when none is named).
VLLM_MLX_MODEL_NAME = "smollm2"
REQUEST_MODEL = {VLLM_MLX: VLLM_MLX_MODEL_NAME}
# The distributions that make up an MLX build: the same ones, same versions, go into vllm-mlx's venv.
MLX_DISTRIBUTIONS = ("mlx", "mlx-cpu", "mlx-cuda-12", "mlx-cuda-13", "mlx-metal")

# What each kind of row adds to the request body. The schema's strings are long enough that
# the answer runs to max_tokens (no early finish to flatter the rate).
FREE = "free"
ANSWER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "summary", "tags"],
                 "properties": {"title": {"type": "string"}, "summary": {"type": "string"},
                                "tags": {"type": "array", "items": {"type": "string"}}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast for a city",
    "parameters": {"type": "object", "required": ["city", "days"],
                   "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
KINDS = {
    FREE: {},
    "schema": {"response_format": {"type": "json_schema",
                                   "json_schema": {"name": "answer", "strict": True, "schema": ANSWER_SCHEMA}}},
    "tool": {"tools": [WEATHER_TOOL], "tool_choice": "required"},
}
CONSTRAINED = tuple(kind for kind in KINDS if kind != FREE)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def our_mode(server: str) -> list[str] | None:
    """Our server's mode flags for a --servers name (None: not ours)."""
    if server in OURS:
        return ["--mode", server]
    batches = server.removeprefix(BATCHES_PREFIX)
    if server.startswith(BATCHES_PREFIX) and batches.isdigit() and int(batches) >= 1:
        return ["--mode", "batch", "--batches", batches]
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def our_mlx_requirements() -> list[str]:
    """Our MLX build as pins (`mlx==V`, and its backend: `mlx-cpu==V` on a Linux CPU build)."""
    pins = []
    for name in MLX_DISTRIBUTIONS:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pass
    return pins


def vllm_mlx_executable(venv: Path) -> Path | None:
    """vllm-mlx's command in its own venv, installed there on first use; None, with the reason
    printed, when it cannot be installed (no network, no disk)."""
    executable = venv / "bin" / VLLM_MLX
    marker = venv / ".installed"  # written last: a venv whose install broke off is installed again
    wanted = "\n".join([VLLM_MLX_REQUIREMENT, *our_mlx_requirements()])
    if executable.exists() and marker.exists() and marker.read_text() == wanted:
        return executable
    requirements = wanted.split("\n")
    print(f"{VLLM_MLX}: installing {' '.join(requirements)} into {venv} "
          f"(a venv of its own, several GB with torch; once, later runs reuse it)", flush=True)
    steps = {"venv": [sys.executable, "-m", "venv", str(venv)],
             "pip install": [str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off",
                             *requirements]}
    for name, step in steps.items():
        try:
            done = subprocess.run(step, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"{VLLM_MLX}: skipped, its install failed ({name}): {exc}", flush=True)
            return None
        if done.returncode != 0:
            print(f"{VLLM_MLX}: skipped, its install failed ({name} exited with {done.returncode}):", flush=True)
            for line in (done.stdout + done.stderr).strip().splitlines()[-8:]:
                print(f"    {line}")
            return None
    marker.write_text(wanted)
    return executable


def server_command(server: str, port: int, max_concurrent: int, folder: str | None,
                   vllm_mlx: Path | None) -> list[str]:
    """The command line that starts `server` on 127.0.0.1:`port`."""
    address = ["--host", "127.0.0.1", "--port", str(port)]
    if server == MLX_LM:
        # Its defaults: continuous batching of up to 32 decodes, 8 prompts at once, a prompt cache.
        return [sys.executable, "-m", "mlx_lm", "server", "--model", folder, *address, "--log-level", "WARNING"]
    if server == VLLM_MLX:
        # Its continuous-batching engine, its defaults otherwise (up to 256 sequences, prefill
        # batches of 8, decode batches of 32, a prefix cache); offline: the folder is all it may read.
        return [str(vllm_mlx), "serve", folder, *address, "--continuous-batching",
                "--served-model-name", VLLM_MLX_MODEL_NAME, "--offline"]
    return [sys.executable, "-m", "emlx_async.serve", *our_mode(server), *address,
            "--max-concurrent", str(max_concurrent), "--log-level", "warning"]


def start_server(command: list[str], log, env: dict | None) -> subprocess.Popen:
    # Into a log file (the peers print a line per request); shown if the server fails.
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()  # SIGTERM: ours drains gracefully; the peers end
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def wait_ready(url: str, process: subprocess.Popen, timeout: float = 600.0) -> None:
    # vllm-mlx imports torch, transformers and gradio before it loads the model: minutes on a busy CPU.
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


class HTTPStatusError(RuntimeError):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status


async def one_request(client: httpx.AsyncClient, model: str | None, prompt: str, tokens: int, ttfts: list,
                      itls: list, kind: str = FREE) -> tuple[int, str, str]:
    """Streams one chat completion of `kind` (a key of KINDS); returns its completion tokens (from
    the usage chunk), its text, and what the server did with the kind's field (field_outcome)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **KINDS[kind]}
    if model is not None:
        body["model"] = model
    start = time.perf_counter()
    last = None
    generated = 0
    text = []
    calls: list[str] = []  # the names of the tool calls streamed
    finish = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise HTTPStatusError(response.status_code, response.text)
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                generated = chunk["usage"]["completion_tokens"]
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            finish = (chunk["choices"][0].get("finish_reason") if chunk.get("choices") else None) or finish
            content = delta.get("content")
            # A call's head (its name) and its arguments' pieces stream as content does: they time
            # the same way (the head is the first a client sees of a call).
            pieces = [call.get("function") or {} for call in delta.get("tool_calls") or []]
            names = [piece["name"] for piece in pieces if piece.get("name")]
            calls += names
            arguments = "".join(piece.get("arguments") or "" for piece in pieces)
            if content or arguments or names:
                now = time.perf_counter()
                if last is None:
                    ttfts.append(now - start)
                else:
                    itls.append(now - last)
                last = now
                text.append((content or "") + arguments)
    return generated, "".join(text), field_outcome(kind, "".join(text), calls, finish)


def field_outcome(kind: str, text: str, calls: list[str], finish: str | None) -> str:
    """"kept" where the answer is what the kind's field asks for (a schema's answer opens a JSON
    object, which max_tokens may cut; a required call calls the tool), else "ignored". A call
    streams from its name on: one that max_tokens cut before its name was whole is "cut" (our
    server gives its text as content)."""
    if kind == FREE:
        return "-"
    if kind == "tool":
        if calls:
            return "kept" if all(name == WEATHER_TOOL["function"]["name"] for name in calls) else "ignored"
        return "cut" if finish == "length" and text.lstrip().startswith("<") else "ignored"
    return "kept" if text.lstrip().startswith("{") else "ignored"


async def load(url: str, model: str | None, clients: int, requests: int, tokens: int, kind: str = FREE) -> dict:
    ttfts: list[float] = []
    itls: list[float] = []
    errors: list[str] = []
    outcomes: list[str] = []  # per request: field_outcome's answer, or "HTTP <status>"
    texts: dict[str, str] = {}
    total = 0

    async def client_loop(index: int) -> None:
        nonlocal total
        async with httpx.AsyncClient(base_url=url, timeout=900) as client:
            for r in range(requests):
                prompt = PROMPTS[(index + r) % len(PROMPTS)]
                try:
                    generated, text, outcome = await one_request(client, model, prompt, tokens, ttfts, itls, kind)
                    total += generated  # not `total += await ...`: that reads total before the await
                    texts.setdefault(prompt, text)
                    outcomes.append(outcome)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(f"{type(exc).__name__}: {exc}")
                    outcomes.append(f"HTTP {exc.status}" if isinstance(exc, HTTPStatusError) else "error")

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    wall = time.perf_counter() - start
    return {"clients": clients, "kind": kind, "tokens": total, "wall": wall, "tok_s": total / wall,
            "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
            "itl_p50": pct(itls, 0.5), "itl_p99": pct(itls, 0.99), "errors": errors, "texts": texts,
            "field": summarize_outcomes(outcomes)}


def summarize_outcomes(outcomes: list[str]) -> str:
    """The row's "field" column: each outcome with its count, e.g. "kept 8/8" or "HTTP 500 8/8"."""
    if not outcomes or set(outcomes) == {"-"}:
        return "-"
    counts = {outcome: outcomes.count(outcome) for outcome in dict.fromkeys(outcomes)}
    return ", ".join(f"{outcome} {count}/{len(outcomes)}" for outcome, count in counts.items())


def print_header(constrained: bool) -> None:
    print(f"{'server':<9} {'clients':>7} {'tokens':>6} {'tok/s':>7} {'ttft p50':>9} {'ttft p99':>9} "
          f"{'itl p50':>8} {'itl p99':>8} {'errors':>6}" + (f" {'kind':<6} field" if constrained else ""))


def print_row(server: str, row: dict, constrained: bool = False) -> None:
    print(f"{server:<9} {row['clients']:>7} {row['tokens']:>6} {row['tok_s']:>7.2f} "
          f"{row['ttft_p50']:>8.2f}s {row['ttft_p99']:>8.2f}s {row['itl_p50'] * 1e3:>6.0f}ms "
          f"{row['itl_p99'] * 1e3:>6.0f}ms {len(row['errors']):>6}"
          + (f" {row['kind']:<6} {row['field']}" if constrained else ""), flush=True)
    for error in row["errors"][:3]:
        print(f"    error: {error}")


async def bench_server(server: str, command: list[str], env: dict | None, port: int, counts: list[int],
                       requests: int, tokens: int, constrained: tuple[str, ...] = ()) -> list[dict]:
    """The rows of one server: at each N its free row, then its constrained rows of each kind."""
    url = f"http://127.0.0.1:{port}"
    model = REQUEST_MODEL.get(server)
    with tempfile.TemporaryFile() as log:
        process = start_server(command, log, env)
        try:
            await wait_ready(url, process)
            # Warm-up: the first request pays one-time costs. With constrained rows, each kind warms
            # every prompt the rows send (their grammar's tokenizer, and the prompt cache, which the
            # first row at N would otherwise fill alone: the ratios compare rows that saw the same cache).
            warm_clients = min(len(PROMPTS), max(counts) + requests - 1) if constrained else 1
            for kind in (FREE, *constrained):
                await load(url, model, warm_clients, 1, 2, kind)
            rows = []
            for n in counts:
                for kind in (FREE, *constrained):
                    rows.append(await load(url, model, n, requests, tokens, kind))
                    print_row(server, rows[-1], bool(constrained))
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
    parser = argparse.ArgumentParser(description="closed-loop load on the HTTP service and on other MLX servers")
    parser.add_argument("--servers", default=f"auto,parallel,{MLX_LM}",
                        help=f"our engine modes ({', '.join(OURS)}, or batchN: batch mode with --batches N) "
                             f"and/or the peers ({', '.join(PEERS)}); "
                             f"{VLLM_MLX} is installed on first use into --vllm-venv (default: %(default)s)")
    parser.add_argument("--clients", default="1,4,8,16")
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per request")
    parser.add_argument("--max-concurrent", type=int, default=8, help="our server's --max-concurrent")
    parser.add_argument("--vllm-venv", type=Path, default=DEFAULT_VLLM_VENV,
                        help=f"the virtual environment {VLLM_MLX} is installed into and run from")
    parser.add_argument("--constrained", nargs="?", const=",".join(CONSTRAINED), default="",
                        metavar="KINDS",
                        help=f"also constrained rows of these kinds ({', '.join(CONSTRAINED)}; all when no list is "
                             "given), each against the same server's free rows")
    args = parser.parse_args()
    constrained = tuple(kind for kind in args.constrained.split(",") if kind)
    if any(kind not in CONSTRAINED for kind in constrained):
        parser.error(f"--constrained takes {', '.join(CONSTRAINED)}, got {args.constrained}")
    counts = [int(n) for n in args.clients.split(",")]
    servers = args.servers.split(",")
    unknown = [server for server in servers if server not in PEERS and our_mode(server) is None]
    if unknown:
        parser.error(f"unknown server(s) {', '.join(unknown)}: choose from {', '.join(OURS + PEERS)} or batchN")
    vllm_mlx = None
    if VLLM_MLX not in servers:
        print(f"{VLLM_MLX}: not in --servers, skipped (naming it installs {VLLM_MLX_REQUIREMENT} into "
              f"{args.vllm_venv}, several GB)")
    else:
        vllm_mlx = vllm_mlx_executable(args.vllm_venv.resolve())
        if vllm_mlx is None:
            servers.remove(VLLM_MLX)
    peers = [server for server in servers if server in PEERS]
    print(f"streamed greedy chat completions, {args.requests} per client, max_tokens {args.tokens}; "
          f"ours with --max-concurrent {args.max_concurrent}"
          + "".join(f", {_peer_description(peer)}" for peer in peers)
          + (f"; constrained rows: {', '.join(constrained)}" if constrained else ""))
    print_header(bool(constrained))
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="emlx-serve-bench-") as tmp:
        folder = None
        if peers:
            from emlx_async.llm.save import convert

            folder = os.path.join(tmp, "smollm2-mlx")
            convert(None, folder)  # SmolLM2's GGUF: the same weights for every server
        for server in servers:
            port = free_port()
            command = server_command(server, port, args.max_concurrent, folder, vllm_mlx)
            env = None
            if server == VLLM_MLX:
                # vllm-mlx saves its prefix cache under ~/.cache at exit and loads it at start: a
                # HOME of its own in the run's temporary directory, so nothing carries over or stays.
                env = {**os.environ, "HOME": tempfile.mkdtemp(prefix="vllm-mlx-home-", dir=tmp)}
            results[server] = asyncio.run(bench_server(server, command, env, port, counts, args.requests,
                                                       args.tokens, constrained))
    if constrained:
        print_constrained(results, constrained)
    free = {server: [row for row in rows if row["kind"] == FREE] for server, rows in results.items()}
    for peer in peers:
        print_comparison(free, peer, counts)
    print_targets(free, peers)


def print_constrained(results: dict[str, list[dict]], kinds: tuple[str, ...]) -> None:
    """Each constrained row's tokens/s over the same server's free row at the same N (target 0.9x)."""
    print("\nconstrained / free, the same server at the same N (tok/s: at least 0.90x)")
    print(f"{'server':<9} {'clients':>7} " + " ".join(f"{kind:>8}" for kind in kinds) + "  field")
    for server, rows in results.items():
        by_key = {(row["clients"], row["kind"]): row for row in rows}
        for n in dict.fromkeys(row["clients"] for row in rows):
            free = by_key[(n, FREE)]["tok_s"]
            ratios = [by_key[(n, kind)]["tok_s"] / free if free else float("nan") for kind in kinds]
            fields = "; ".join(f"{kind}: {by_key[(n, kind)]['field']}" for kind in kinds)
            print(f"{server:<9} {n:>7} " + " ".join(f"{ratio:>7.2f}x" for ratio in ratios) + f"  {fields}")


def print_comparison(results: dict[str, list[dict]], peer: str, counts: list[int]) -> None:
    theirs = {row["clients"]: row for row in results[peer]}
    print(f"\nours / {peer} (tok/s: higher is better; ttft p99: lower is better)")
    print(f"{'server':<9} {'clients':>7} {'tok/s':>7} {'ttft p99':>9}")
    for server, rows in results.items():
        if server in PEERS:
            continue
        for row in rows:
            other = theirs[row["clients"]]
            print(f"{server:<9} {row['clients']:>7} {row['tok_s'] / other['tok_s']:>6.2f}x "
                  f"{row['ttft_p99'] / other['ttft_p99']:>8.2f}x")
    # The same weights and greedy decoding: the texts should agree (batched
    # float arithmetic may still move a late token).
    reference = results[peer][0]["texts"]
    for server, rows in results.items():
        if server != peer:
            texts = rows[0]["texts"]
            same = sum(texts.get(p) == t for p, t in reference.items())
            print(f"greedy texts at N={counts[0]}, {server} against {peer}: {same} of {len(reference)} equal")


def print_targets(results: dict[str, list[dict]], peers: list[str]) -> None:
    """Each of our servers against each peer: at 8 clients at least 1.3x its tokens/s and a lower
    p99 time to first token; at 1 client at least its tokens/s."""
    for server in results:
        if server not in PEERS and peers:
            print_server_targets(results, server, peers)


def print_server_targets(results: dict[str, list[dict]], server: str, peers: list[str]) -> None:
    ours = {row["clients"]: row for row in results[server]}
    print(f"\ntargets, {server} against each peer")
    for peer in peers:
        theirs = {row["clients"]: row for row in results[peer]}
        checks = []
        if 8 in ours:
            speed = ours[8]["tok_s"] / theirs[8]["tok_s"]
            ttft = ours[8]["ttft_p99"] / theirs[8]["ttft_p99"]
            checks.append(f"8 clients tok/s {speed:.2f}x (>= 1.30x: {_verdict(speed >= 1.3)}), "
                          f"ttft p99 {ttft:.2f}x (< 1.00x: {_verdict(ttft < 1.0)})")
        if 1 in ours:
            speed = ours[1]["tok_s"] / theirs[1]["tok_s"]
            checks.append(f"1 client tok/s {speed:.2f}x (>= 1.00x: {_verdict(speed >= 1.0)})")
        print(f"{peer:<9} " + ("; ".join(checks) or "needs --clients with 1 and/or 8"))


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


def _peer_description(peer: str) -> str:
    if peer == MLX_LM:
        return f"{MLX_LM} {version('mlx-lm')} with its defaults"
    return f"{VLLM_MLX_REQUIREMENT.replace('==', ' ')} with --continuous-batching and its defaults"


if __name__ == "__main__":
    main()
