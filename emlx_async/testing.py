"""Helpers for users' tests: leak checks for workers, threads and fds."""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

from . import _backend
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
            raise RuntimeError("this LoopLag is already running")
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
