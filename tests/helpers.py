"""Slow stand-ins for race injection: jobs that block a worker until released."""

from __future__ import annotations

import threading
import time

import emlx_async as ea


class Gate:
    """A Python job that holds its worker until `open()` is called.

    `started` is set once the job is running on the worker.
    """

    def __init__(self) -> None:
        self.started = threading.Event()
        self._release = threading.Event()

    def __call__(self, value=None):
        self.started.set()
        if not self._release.wait(30):
            raise TimeoutError("Gate was never opened")
        return value

    def open(self) -> None:
        self._release.set()


async def wait_started(gate: Gate, timeout: float = 10.0) -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not gate.started.is_set():
        assert time.monotonic() < deadline, "job never started"
        await asyncio.sleep(0.001)


def cancellable_spin(log: list) -> str:
    """Runs until ea.cancelled() turns true; records how it ended."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if ea.cancelled():
            log.append("saw-cancel")
            return "stopped"
        time.sleep(0.001)
    log.append("timeout")
    return "timeout"

