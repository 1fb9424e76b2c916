"""Helpers for users' tests: leak checks for workers, threads and fds."""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

from . import _backend
from ._errors import InvalidArgument, InvalidState
from ._native import lib


def active_workers() -> int:
    """Worker threads leased to a queue right now (0 once every queue is closed)."""
    return lib.emlx_workers_active()


def parked_workers() -> int:
    """Idle worker threads kept with their MLX stream for reuse."""
    return lib.emlx_workers_parked()


def thread_count() -> int:
    """OS threads in this process (Linux: /proc/self/task)."""
    return len(os.listdir("/proc/self/task"))


def open_fds() -> set[int]:
    """This process's open file descriptors (Linux: /proc/self/fd)."""
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


class LoopLag:
    """Measures how late the event loop wakes a ticker that sleeps `interval` seconds.

    ``async with LoopLag() as lag: ...`` runs the ticker for the block (or
    ``lag = LoopLag().start()`` ... ``await lag.stop()``), on asyncio, uvloop
    or trio; ``lag.samples`` holds each wake-up's delay in seconds,
    ``lag.p99()`` the 99th percentile. A loop blocked by MLX work shows up
    here at once.
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._ticker: Any = None
        self._finished: anyio.Event | None = None

    async def _run(self) -> None:
        try:
            while True:
                start = time.perf_counter()
                await anyio.sleep(self.interval)
                self.samples.append(max(0.0, time.perf_counter() - start - self.interval))
        finally:
            self._finished.set()

    def start(self) -> LoopLag:
        """Start the ticker as a background task of the running loop (sync, so a plain function can call it)."""
        if self._ticker is not None:
            raise InvalidState("this LoopLag is already running")
        self._finished = anyio.Event()
        self._ticker = _backend.current().spawn(self._run)
        return self

    async def stop(self) -> None:
        """Stop the ticker and wait until it has ended."""
        if self._ticker is not None:
            self._ticker.cancel()
            await self._finished.wait()
            self._ticker = None

    async def __aenter__(self) -> LoopLag:
        return self.start()

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    def p99(self) -> float:
        """99th percentile lag in seconds (0.0 before any sample)."""
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class LocalRing:
    """`n` ranks of one command on this machine, joined by MLX's ring backend on loopback.

    What ``mlx.launch --backend ring -n N`` does on one host, with the
    processes in the caller's hands: each rank is a ``subprocess.Popen``
    (``ranks[i]``) whose stdout and stderr go to files, so a test can kill
    one rank and must reap them all (``close()``, also on ``with`` exit,
    kills what is left and waits for it).

    Example:
        >>> with LocalRing(3, [sys.executable, "rank.py"]) as ring:
        ...     codes = ring.wait(timeout=60)
    """

    def __init__(self, n: int, argv: list[str], *, env: dict[str, str] | None = None,
                 directory: str | None = None) -> None:
        import json
        import socket
        import subprocess
        import tempfile

        if n < 1:
            raise InvalidArgument(f"a ring needs at least one rank, got {n}")
        self._tmp = tempfile.TemporaryDirectory(prefix="emlx-ring-", dir=directory)
        ports = []
        holders = []
        for _ in range(n):  # free loopback ports, held until all are chosen so they differ
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            holders.append(s)
            ports.append(s.getsockname()[1])
        for s in holders:
            s.close()
        self.hostfile = os.path.join(self._tmp.name, "hosts.json")
        with open(self.hostfile, "w") as f:
            json.dump([[f"127.0.0.1:{p}"] for p in ports], f)
        self.ranks: list[subprocess.Popen] = []
        self.logs: list[tuple[str, str]] = []
        try:
            for rank in range(n):
                out, err = (os.path.join(self._tmp.name, f"rank{rank}.{k}") for k in ("out", "err"))
                self.logs.append((out, err))
                rank_env = {**os.environ, **(env or {}), "MLX_HOSTFILE": self.hostfile, "MLX_RANK": str(rank)}
                with open(out, "wb") as o, open(err, "wb") as e:
                    self.ranks.append(subprocess.Popen(argv, env=rank_env, stdout=o, stderr=e,
                                                       stdin=subprocess.DEVNULL))
        except BaseException:
            self.close()
            raise

    def output(self, rank: int) -> str:
        """What `rank` wrote to stdout so far."""
        with open(self.logs[rank][0], errors="replace") as f:
            return f.read()

    def errors(self, rank: int) -> str:
        """What `rank` wrote to stderr so far."""
        with open(self.logs[rank][1], errors="replace") as f:
            return f.read()

    def wait(self, timeout: float) -> list[int | None]:
        """Wait up to `timeout` seconds in all for every rank; their exit codes (None: still running)."""
        import subprocess

        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for process in self.ranks:
            try:
                codes.append(process.wait(max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def close(self) -> None:
        """Kill every rank still running and reap them all; remove the files."""
        for process in self.ranks:
            if process.poll() is None:
                process.kill()
        for process in self.ranks:
            process.wait()
        self._tmp.cleanup()

    def __enter__(self) -> LocalRing:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
